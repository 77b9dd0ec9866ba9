/*
 * The socket helpers of net.h: blocking sockets whose every wait goes through
 * poll() with the caller's deadline, so a handshake can never hang past its
 * timeout (a peer that connects and says nothing, a listener that never
 * comes up).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "parallel/net.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double dsv4_net_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int dsv4_net_ms_left(double deadline) {
    double l = deadline - dsv4_net_now_s();
    return l <= 0 ? 0 : l > 1e6 ? 1000000000 : (int)(l * 1000) + 1;
}

int dsv4_net_io_all(int fd, void *buf, size_t n, int writing, double deadline) {
    uint8_t *p = buf;
    while (n) {
        struct pollfd pf = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int pr = poll(&pf, 1, dsv4_net_ms_left(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr == 0) return -2;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int dsv4_net_resolve(const char *addr, int port, int passive, struct addrinfo **res) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (passive) hints.ai_flags = AI_PASSIVE;
    return getaddrinfo(addr, ps, &hints, res);
}

int dsv4_net_listen(const struct addrinfo *ai, int *sys_errno) {
    int ls = -1;
    *sys_errno = 0;
    for (const struct addrinfo *a = ai; a && ls < 0; a = a->ai_next) {
        ls = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (ls < 0) continue;
        int one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, a->ai_addr, a->ai_addrlen) || listen(ls, 64)) {
            *sys_errno = errno;
            close(ls);
            ls = -1;
        }
    }
    return ls;
}

int dsv4_net_connect(const struct addrinfo *ai, double deadline, int retry_ms, char *peer, size_t peer_n,
                     int *sys_errno) {
    int fd = -1;
    *sys_errno = 0;
    for (;;) {
        for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen)) {
                *sys_errno = errno;
                close(fd);
                fd = -1;
            } else if (peer) {
                dsv4_net_addr_name(a->ai_addr, a->ai_addrlen, peer, peer_n);
            }
        }
        if (fd >= 0 || dsv4_net_now_s() >= deadline) return fd;
        struct timespec ts = {retry_ms / 1000, (long)(retry_ms % 1000) * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void dsv4_net_addr_name(const struct sockaddr *sa, socklen_t len, char *out, size_t n) {
    char h[NI_MAXHOST] = "?", s[NI_MAXSERV] = "?";
    getnameinfo(sa, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, n, "%s:%s", h, s);
}
