import pytest

from simhost.guest_image import ensure_guest_image


@pytest.fixture(scope='session')
def guest_image():
    return ensure_guest_image()
