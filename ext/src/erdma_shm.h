/* erdma_shm.h - shared memory between ranks on one host (erdma_shm.c).
 *
 * The component owns the engine's shared-memory state (shm_state: the
 * local ranks, our inbound rings, CMA and spinning), the rings that stand
 * in for QUIC on a connection between two local ranks, single-copy reads
 * and writes (process_vm_readv/writev), and the waits of application
 * threads.  It includes erdma_conn.h because a shared-memory connection is
 * an erdma_conn without ngtcp2 that carries the same frames (frame_hdr). */
#ifndef ERDMA_SHM_H
#define ERDMA_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "erdma.h"
#include "erdma_conn.h"
#include "erdma_match.h"

/* ---- shared memory between ranks on one host (erdma_shm.c) ----
 * A connection to a local rank is reached through its channel,
 * erdma_shm_chan (erdma_conn.h): eager frames into the ring, CMA reads. */
/* Two-rank Barriers by flags (shm_pair_*, erdma_pair_* in erdma.h): slots
 * per rank, each two lines of its segment; a Barrier's token names one
 * as 0x80 | slot. */
/* a send of an exchange (ERDMA_SEND_EXCHANGE) up to this many bytes is
 * still demoted as a reply (ring_demote in erdma_shm.c) */
#define SHM_DEMOTE_EXCHANGE_MAX 256
/* Before a send with `flags` on c (under e->mu): one of an exchange above
 * that size is not a reply, and its ring bytes stay undemoted.  An
 * exchange: said by the caller (Sendrecv, a collective's round), or a
 * receive from the peer already posted (Irecv then Isend). */
static inline void shm_note_send(erdma_conn *c, int flags, uint64_t nbytes) {
  if (c->rx_since_tx && nbytes > SHM_DEMOTE_EXCHANGE_MAX &&
      ((flags & ERDMA_SEND_EXCHANGE) || posted_from(c->e, c->peer)))
    c->rx_since_tx = 0;
}
#define SHM_PAIRS 128
typedef struct shm_pair {
  uint32_t ctx;                 /* the communicator's collective context; 0: free */
  int on;                       /* agreed with the peer */
  int peer;                     /* world rank */
  uint32_t count;               /* our operations by flags so far */
  uint32_t slack;               /* a wait ends with the peer this many operations behind
                                   (erdma_pair_lead; 0 after any other call) */
  int data_wait;                /* erdma_pair_share's: the peer's bytes also end a wait */
  int expecting;                /* counted by _expect / _share, not yet taken (_withdraw) */
  int parked;                   /* freed before the peer took our last bytes (shm_pair_forget) */
  _Atomic uint64_t *mine, *theirs; /* ctx << 32 | count, ours and the peer's slot */
  uint8_t *my_area, *their_area;  /* the slots' areas for bytes beyond their lines */
  struct shm_seg *peer_seg;
} shm_pair;

typedef struct shm_state {
  char job[64];
  int *local;            /* world ranks on this host, ascending */
  int nlocal;
  int my_index;
  uint64_t ring_bytes;
  struct shm_seg *seg;   /* our inbound rings */
  size_t map_len;
  char name[128];
  int unlinked;
  uint64_t next_liveness;
  int cma;               /* single-copy reads (process_vm_readv) allowed */
  int oversub;           /* more local ranks than CPUs: spinners yield every turn */
  int demote;            /* lines written for a local peer go to the shared cache
                          * (erdma_demote; cfg.shm_demote) */
  int lf_spin;           /* threads peeking at the rings without e->mu (atomic) */
  uint64_t spin_ns;      /* a waiter's spin now (adapts; 0: cfg.spin_us) */
  int held;              /* drain_ring left a peer's bytes in its ring (shm_hold_max) */
  struct shm_seg **maps; /* local peers' segments by local index, mapped until the
                          * engine is freed (a pair slot's reader and connections
                          * hold pointers into them) */
  int nmaps;
  size_t maps_len;
  shm_pair pair[SHM_PAIRS];
  unsigned pair_gen;     /* bumped when a pair is agreed or forgotten */
} shm_state;

/* shm.c (all under e->mu) */
int shm_attach_peers(erdma_engine *e);  /* 0 when all attached, 1 if some not yet */
int shm_is_local(erdma_engine *e, int rank);
int shm_poll(erdma_engine *e);          /* returns bytes consumed */
int shm_poll_rings(erdma_engine *e);    /* the same without liveness checks (spinners) */
int shm_sleep_prepare(erdma_engine *e); /* 1: data pending, don't sleep */
/* unexpected bytes taken from a local peer before its bytes stay in its
 * ring: cfg.shm_unexpected_max, or cfg.unexpected_max while a receive, a
 * probe or a send here waits (see erdma_shm.c) */
uint64_t shm_hold_max(const erdma_engine *e);
/* something here now waits: if a peer's bytes were left in its ring, read on */
void shm_hold_lifted(erdma_engine *e);
void shm_hold_taken(erdma_engine *e);  /* an unexpected message taken (e->mu held) */
void shm_sleep_done(erdma_engine *e);
void shm_spin_begin(erdma_engine *e);
void shm_spin_end(erdma_engine *e);
int shm_rx_ready(erdma_engine *e);      /* lock-free: some inbound ring has bytes */
int shm_shares_cpu(erdma_engine *e);    /* lock-free: a local peer runs on our CPU */
int shm_move_off_cpu(erdma_engine *e);  /* lock-free: go to another CPU of our mask */
int shm_wait(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t deadline);
void shm_wake_waiters(erdma_engine *e); /* a request completed */
void shm_app_active(erdma_engine *e);   /* an application thread leaves a call */
void shm_app_idle(erdma_engine *e);     /* ... or sleeps on e->cv */
uint64_t shm_next_wake(erdma_engine *e, uint64_t exp, uint64_t now);
void shm_teardown(erdma_engine *e);
void shm_unmap_peers(erdma_engine *e); /* after the connections are freed */
void shm_pair_forget(erdma_engine *e, uint32_t ctx); /* a communicator freed (e->mu held) */
/* bulk copies for the one-host collectives (no lock needed) */
int shm_cma_ok(erdma_engine *e, int peer);
/* a send with these flags of nbytes to a local peer goes by RTS and a CMA
 * read rather than into its ring (ERDMA_SEND_BULK, cfg.shm_bulk_cma_min) */
int shm_bulk_by_cma(const erdma_engine *e, uint64_t nbytes, int flags);
/* 1 if a point-to-point message (context ctx) with these send flags goes by
 * RTS and CMA rather than into the ring (cfg.shm_p2p_split_min,
 * cfg.shm_p2p_cma_min) */
int shm_p2p_by_cma(const erdma_engine *e, uint64_t nbytes, int flags, uint32_t ctx);
/* CMA is on towards `peer` and a read from it has succeeded before */
int shm_cma_read_seen(erdma_engine *e, int peer);
int shm_cma_copy(erdma_engine *e, int peer, void *local, uint64_t remote, uint64_t n,
                 int write);

#endif /* ERDMA_SHM_H */
