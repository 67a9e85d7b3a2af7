/* Inter-VM ping-pong: through an ivshmem region (BAR2, sysfs resource2) or
 * over TCP, the same 8-byte round trip, so the two paths compare side by side.
 *   shm-pingpong shm RESOURCE2 OFFSET ROLE ITERS
 *   shm-pingpong tcp PEER_IP PORT ROLE ITERS       (role 1 listens)
 * Role 0 sends, role 1 echoes. Role 0 prints
 *   shm-pingpong: <shm|tcp> iterations N avg_rtt_us X
 * Static, libc only: it runs in the busybox test guest. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READY 0x5245414459ULL   /* role 1 is there */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void report(const char *kind, long n, double us) {
    printf("shm-pingpong: %s iterations %ld avg_rtt_us %.3f\n", kind, n, us / n);
    fflush(stdout);
}

static int shm(const char *path, long offset, int role, long n) {
    int fd = open(path, O_RDWR | O_SYNC);
    if (fd < 0) { perror(path); return 1; }
    long len = offset + 4096;
    volatile uint64_t *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 1; }
    /* own cache lines: ping, pong, ready */
    volatile uint64_t *ping = base + offset / 8, *pong = ping + 8, *ready = ping + 16;
    if (role == 1) {
        *pong = 0;
        *ready = READY;
        for (long i = 1; i <= n; i++) {
            while (*ping != (uint64_t)i) ;
            *pong = i;
        }
        return 0;
    }
    *ping = 0;
    while (*ready != READY) ;
    *ready = 0;
    double t0 = now_us();
    for (long i = 1; i <= n; i++) {
        *ping = i;
        while (*pong != (uint64_t)i) ;
    }
    report("shm", n, now_us() - t0);
    return 0;
}

static int tcp(const char *ip, int port, int role, long n) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    int one = 1, s;
    uint64_t v = 0;
    if (role == 1) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) { perror("listen"); return 1; }
        s = accept(l, NULL, NULL);
    } else {
        inet_pton(AF_INET, ip, &a.sin_addr);
        for (;;) {
            s = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(s, (void *)&a, sizeof a) == 0) break;
            close(s);
            usleep(200000);
        }
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double t0 = now_us();
    for (long i = 1; i <= n; i++) {
        if (role == 0 && write(s, &i, 8) != 8) return 1;
        if (recv(s, &v, 8, MSG_WAITALL) != 8) return 1;
        if (role == 1 && write(s, &v, 8) != 8) return 1;
    }
    if (role == 0) report("tcp", n, now_us() - t0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "shm"))
        return shm(argv[2], atol(argv[3]), atoi(argv[4]), atol(argv[5]));
    if (argc == 6 && !strcmp(argv[1], "tcp"))
        return tcp(argv[2], atoi(argv[3]), atoi(argv[4]), atol(argv[5]));
    fprintf(stderr, "usage: shm-pingpong shm RESOURCE2 OFFSET ROLE ITERS | tcp PEER PORT ROLE ITERS\n");
    return 2;
}
