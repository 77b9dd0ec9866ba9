/* Helpers for the tests that run ranks / nodes as forked processes talking
 * over 127.0.0.1 (test_comm_tcp.c, test_rendezvous.c): a loopback port, and a
 * child whose fixed-size result comes back through a pipe. */
#ifndef DSV4_PROC_TEST_UTIL_H
#define DSV4_PROC_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* A TCP socket bound to 127.0.0.1 on a port the kernel picks (*port). */
static inline int pt_loopback_socket(int *port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &l);
    *port = ntohs(a.sin_port);
    return s;
}

/* A loopback port free a moment ago (the socket that held it is closed). */
static inline int pt_free_port(void) {
    int port;
    close(pt_loopback_socket(&port));
    return port;
}

/* Fork a child that runs fn(arg, out) on a zeroed buffer of size bytes and
 * sends it through a pipe; exit status 0, or 3 when the write fell short.
 * alarm() turns a hang into a failure instead of a stuck CI job. Returns the
 * child's pid (-1 on failure), *rd the pipe's read end. */
static inline pid_t pt_fork_result(void (*fn)(void *arg, void *out), void *arg, size_t size, int *rd) {
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        close(p[0]);
        void *out = calloc(1, size);
        if (!out) _exit(2);
        fn(arg, out);
        ssize_t w = write(p[1], out, size);
        _exit(w == (ssize_t)size ? 0 : 3);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    *rd = p[0];
    return pid;
}

/* Read the child's size bytes into out and reap it. 1 when they all came and
 * it exited with status 0, else 0. */
static inline int pt_collect_result(pid_t pid, int rd, void *out, size_t size) {
    size_t got = 0;
    while (got < size) {
        ssize_t k = read(rd, (char *)out + got, size - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(rd);
    int st = 0;
    waitpid(pid, &st, 0);
    return got == size && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#endif
