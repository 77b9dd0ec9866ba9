/*
 * net.h — the blocking-socket helpers shared by the multi-node rendezvous
 * (rendezvous.c) and the TCP communicator's setup (comm_tcp.c)
 * (DESIGN.md "Parallelism": --nnodes / --master-addr / --master-port).
 *
 * Why one place: both handshakes do the same things — resolve addr:port,
 * listen on the first address that binds, connect with retries until the
 * node that listens is up, and move exactly n bytes before a deadline — and
 * a fix to one (EINTR, a half-written buffer, SIGPIPE) must reach both. Each
 * caller keeps its own error messages: the helpers return the system / resolver
 * code and the caller names the flag or rank at fault.
 *
 * Deadlines are absolute CLOCK_MONOTONIC seconds (dsv4_net_now_s() + timeout).
 * Sockets are blocking and close-on-exec; sends use MSG_NOSIGNAL, so a peer
 * that hangs up is an error return, never SIGPIPE.
 */
#ifndef DSV4_PARALLEL_NET_H
#define DSV4_PARALLEL_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

struct addrinfo;

/* Seconds (double) on CLOCK_MONOTONIC: the clock every deadline here uses. */
double dsv4_net_now_s(void);
/* Milliseconds until deadline as a poll() timeout: 0 once it passed, at most 1e9 (no int overflow). */
int dsv4_net_ms_left(double deadline);

/*
 * dsv4_net_io_all — send (writing = 1) or receive (0) exactly n bytes of buf
 * on the blocking socket fd, each wait bounded by `deadline` (poll()). Returns
 * 0 when all n bytes moved; -1 the peer closed the connection or a socket
 * error (errno tells which; 0 bytes read = end of file); -2 the deadline
 * passed first. Retries EINTR / EAGAIN. n == 0 returns 0 at once.
 */
int dsv4_net_io_all(int fd, void *buf, size_t n, int writing, double deadline);

/*
 * dsv4_net_resolve — getaddrinfo(addr, port) for a TCP stream socket of any
 * family (IPv4 / IPv6 literal or host name); passive = 1 for a listener.
 * Returns 0 with *res to freeaddrinfo, or getaddrinfo's code (for
 * gai_strerror; the caller words the message).
 */
int dsv4_net_resolve(const char *addr, int port, int passive, struct addrinfo **res);

/*
 * dsv4_net_listen — a socket bound (SO_REUSEADDR) and listening (backlog 64)
 * on the first address of the list `ai` that takes it. Returns the fd, or -1
 * with *sys_errno = errno of the last failed bind/listen (EADDRINUSE: the
 * port is taken; 0 if no socket could be created).
 */
int dsv4_net_listen(const struct addrinfo *ai, int *sys_errno);

/*
 * dsv4_net_connect — connect to the first address of `ai` that accepts;
 * when none does (the listener is not up yet), sleep retry_ms milliseconds
 * and try again until `deadline` (at least one round is tried). Returns the
 * connected fd, or -1 with *sys_errno = errno of the last failed connect.
 * peer (may be NULL): "host:port" (numeric) of the address connected to.
 */
int dsv4_net_connect(const struct addrinfo *ai, double deadline, int retry_ms, char *peer, size_t peer_n,
                     int *sys_errno);

/* "host:port" (numeric) of a socket address into out[0..n); "?" for a part that does not resolve. */
void dsv4_net_addr_name(const struct sockaddr *sa, socklen_t len, char *out, size_t n);

/* Big-endian (network order) integers in wire headers. */
static inline void dsv4_net_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static inline uint32_t dsv4_net_get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void dsv4_net_put64(uint8_t *p, uint64_t v) {
    dsv4_net_put32(p, (uint32_t)(v >> 32));
    dsv4_net_put32(p + 4, (uint32_t)v);
}
static inline uint64_t dsv4_net_get64(const uint8_t *p) {
    return (uint64_t)dsv4_net_get32(p) << 32 | dsv4_net_get32(p + 4);
}

#ifdef __cplusplus
}
#endif
#endif
