/* comm_tcp_internal.h: what the tcp backend's two halves share: the rendezvous that builds
 * the full mesh of sockets (comm_tcp_mesh.c) and the collectives over it (comm_tcp.c). */
#ifndef ZCK_COMM_TCP_INTERNAL_H
#define ZCK_COMM_TCP_INTERNAL_H

#include "comm.h"

#include <stddef.h>

/* "host:port" or "[v6host]:port" of a peer, for messages. */
#define ZCK__TCP_ADDR_MAX 320

/* Seconds on a monotonic clock. */
double zck__tcp_now(void);

/* Connects this rank to every other: on return fds[k] is a non-blocking, TCP_NODELAY
 * socket to rank k (fds[rank] = -1) and addrs[k] names rank k's address. Waits at most
 * timeout_s in all for the others (rank 0 may start after them). On failure every socket
 * it opened is closed and fds[] is all -1. */
zck_status zck__tcp_mesh(const zck_comm_tcp_options *o, double timeout_s, int *fds, char (*addrs)[ZCK__TCP_ADDR_MAX]);

#endif
