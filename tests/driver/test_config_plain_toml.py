"""The configuration's plain TOML, read without tomllib (the monitoring
probe's start), gives exactly what tomllib gives, and leaves every other
text, errors included, to tomllib."""

import random
import tomllib
from pathlib import Path

import pytest

from kvm_sriov import config

REPO = Path(__file__).resolve().parents[2]
SAMPLES = [
    "", "\n\n", "# only a comment\n",
    '[pool]\npfs = ["mlx5_0", "0000:81:00.0"]\nstate_dir = "/var/lib/one/kvm-sriov"\n',
    "[pool]\nskip_vfs_in_host_use = false # trailing\nreservation_grace_seconds = 0\n",
    "[a]\nx = +5\ny = -0\nz = []\nw = [ 'a' , \"b\", ]\nv = [1,2,3]\n[b]\n",
    "top = 1\n[t]\nk = 'lit#not a comment'\n",
    "[ spaced ]\n\tk\t=\t'tab'\t# c\n",
]
REFUSED = [  # valid TOML outside the plain subset, and invalid TOML: tomllib decides
    'a = "esc\\n"\n', "a = 1.5\n", "a = 1_000\n", "a = 0x10\n", "a = 1979-05-27\n", "a.b = 1\n",
    '"q" = 1\n', "[a.b]\n", "[[a]]\n", "a = {x = 1}\n", 'a = """x"""\n', "a = [\n 1,\n]\n",
    "a = [[1]]\n", "a = 'é'\n", "a = 1\r\n", "a = 1\na = 2\n", "[a]\n[a]\n", "a = 01\n",
    "a = \n", "a = tru\n", "a = 1 2\n", "[a] x\n", "a = 'x\n", "a = [1\n", "= 1\n", "a = inf\n",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_plain_files_read_as_tomllib_reads_them(text):
    assert config._plain_toml(text) == tomllib.loads(text)


@pytest.mark.parametrize("text", REFUSED)
def test_everything_else_is_left_to_tomllib(text):
    assert config._plain_toml(text) is None


def test_the_shipped_files_take_the_plain_path():
    for path in [REPO / "etc/vmm/kvm-sriov/kvm-sriov.toml"]:
        text = path.read_text()
        assert config._plain_toml(text) == tomllib.loads(text) != {}, path


def test_mutated_files_either_match_tomllib_or_are_refused():
    """Random edits of the samples: whatever the plain reader accepts,
    tomllib accepts with the same result."""
    rnd = random.Random(28)
    alphabet = list(" \t\n#=[]{},.\"'+-_01239afxtrue\\é\r")
    accepted = 0
    for _ in range(20000):
        text = list(rnd.choice(SAMPLES + REFUSED))
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(text) + 1)
            if text and rnd.random() < 0.4:
                del text[min(i, len(text) - 1)]
            else:
                text.insert(i, rnd.choice(alphabet))
        text = "".join(text)
        plain = config._plain_toml(text)
        if plain is not None:
            accepted += 1
            assert plain == tomllib.loads(text), repr(text)
    assert accepted > 1000


def test_a_bad_file_still_names_the_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[pool]\npfs = [\n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(files=[bad])
