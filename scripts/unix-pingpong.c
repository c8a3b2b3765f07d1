/*
 * A Unix-socket ping-pong: does a reader that waits in poll() before
 * read() take fewer context switches, and is it faster, than one blocked
 * in read()? (sluice-client's Rx::recv chooses between the two; README,
 * "Spurious wake-ups".)
 *
 *   gcc -O2 -o /tmp/unix-pingpong scripts/unix-pingpong.c
 *   /tmp/unix-pingpong CLIENT_CPU SERVER_CPU POLL ROUNDS
 *   e.g. /tmp/unix-pingpong 1 0 0 20000; /tmp/unix-pingpong 1 0 1 20000
 *
 * The client sends 64 bytes and waits for 4,096; the server answers each.
 * Prints the time per round trip and the context switches of both.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) perror("sched_setaffinity");
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CLIENT_CPU SERVER_CPU POLL(0|1) ROUNDS\n", argv[0]);
        return 2;
    }
    int ccpu = atoi(argv[1]), scpu = atoi(argv[2]), use_poll = atoi(argv[3]), n = atoi(argv[4]);
    static char buf[4096];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return perror("socketpair"), 1;
    double t0 = now();
    if (fork() == 0) {
        pin(scpu);
        close(sv[0]);
        for (int i = 0; i < n; i++) {
            if (read(sv[1], buf, 64) <= 0) break;
            if (write(sv[1], buf, 4096) != 4096) break;
        }
        _exit(0);
    }
    if (fork() == 0) {
        pin(ccpu);
        close(sv[1]);
        for (int i = 0; i < n; i++) {
            if (write(sv[0], buf, 64) != 64) _exit(1);
            for (int got = 0; got < 4096;) {
                if (use_poll) {
                    struct pollfd f = {sv[0], POLLIN, 0};
                    poll(&f, 1, -1);
                }
                int r = read(sv[0], buf, 4096 - got);
                if (r <= 0) _exit(1);
                got += r;
            }
        }
        _exit(0);
    }
    close(sv[0]);
    close(sv[1]);
    while (wait(NULL) > 0) {}
    double t = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    printf("client cpu %d, server cpu %d, %s: %.1f us per round trip, %.2f context switches per round trip\n", ccpu, scpu,
           use_poll ? "poll then read" : "blocking read", t / n * 1e6, (double)(ru.ru_nvcsw + ru.ru_nivcsw) / n);
    return 0;
}
