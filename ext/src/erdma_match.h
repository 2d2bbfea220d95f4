/* erdma_match.h - requests and unexpected messages (erdma_match.c).
 *
 * The component owns the engine's requests (struct erdma_req: sends and
 * receives, their completion and reference counts) and the messages that
 * arrived before a receive matched them (struct erdma_msg), the MPI match
 * rule on (source, tag, context) and the intrusive lists that queue both.
 * It needs only the public types of erdma.h: the engine's queues are
 * fields of struct erdma_engine (erdma_engine.h), which the functions reach
 * through their erdma_engine pointer. */
#ifndef ERDMA_MATCH_H
#define ERDMA_MATCH_H

#include <stdint.h>

#include "erdma.h"

enum { REQ_SEND = 1, REQ_RECV = 2 };

struct erdma_req {
  erdma_engine *e;
  int kind;
  int done;
  int user_freed;        /* erdma_req_free called before completion */
  int engine_refs;       /* engine structures still pointing at it */
  erdma_status st;
  uint64_t id;           /* for RTS/CTS */
  /* receive */
  void *buf;
  uint64_t cap;
  int alloc;
  int source, tag;
  uint32_t ctx;
  /* send */
  const void *sbuf;
  uint64_t nbytes;
  int dest;
  int flags;
  uint64_t got;          /* chunked receive: payload bytes arrived so far */
  uint64_t chunks_left;  /* chunked send: chunks not yet acknowledged */
  uint32_t cma_sid;      /* send readable with CMA under this id (erdma_shm.c) */
  const struct erdma_chan *offered; /* the channel its buffer is offered on, to withdraw */
  uint64_t claimed;      /* chunked receive: payload bytes announced by CHUNK headers */
  int chunked;           /* a CHUNK arrived for it: a DATA frame is refused */
  int rndv_listed;       /* in e->rndv_recv (waiting for DATA or CHUNKs) */
  int rx_refs;           /* rx states (erdma_conn.c) filling it */
  struct erdma_req *prev, *next; /* posted-receive queue / pending-send list */
};

struct erdma_msg {
  int source, tag;
  uint32_t ctx;
  uint64_t len;
  int rndv;              /* RTS only: data still at the sender */
  int sync;
  uint64_t sender_id;
  uint64_t cma_addr;     /* FR_FLAG_CMA: the payload's address in the sender */
  int cma;
  uint8_t *data;         /* eager payload (owned; from msgbuf_get if pooled) */
  int pooled;
  uint64_t arrived;
  int complete;
  int queued;            /* in the unexpected queue */
  int taken;             /* held by a matched probe (erdma_msg handle) */
  int error;             /* its sender failed before the payload was complete */
  erdma_req *bound;      /* receive waiting for the rest of the payload */
  erdma_req *sreq;       /* local synchronous send completed on match */
  erdma_engine *acct_e;  /* acct bytes count against peer `source`'s unexpected bound */
  uint64_t acct;
  struct erdma_msg *prev, *next;
};

/* intrusive doubly linked list of reqs or msgs */
#define DL_APPEND(head, tail, x) do { (x)->next = NULL; (x)->prev = (tail); \
    if (tail) (tail)->next = (x); else (head) = (x); (tail) = (x); } while (0)
#define DL_REMOVE(head, tail, x) do { \
    if ((x)->prev) (x)->prev->next = (x)->next; else (head) = (x)->next; \
    if ((x)->next) (x)->next->prev = (x)->prev; else (tail) = (x)->prev; \
    (x)->prev = (x)->next = NULL; } while (0)

/* match.c (all under e->mu) */
erdma_req *req_new(erdma_engine *e, int kind);
void req_complete(erdma_req *r, int error);
void req_release(erdma_req *r);      /* drop an engine reference */
int match(int want_src, int want_tag, uint32_t want_ctx, int src, int tag, uint32_t ctx);
erdma_req *posted_take(erdma_engine *e, int src, int tag, uint32_t ctx);
int posted_from(const erdma_engine *e, int src);
erdma_msg *unexp_find(erdma_engine *e, int src, int tag, uint32_t ctx);
erdma_msg *msg_new(int src, int tag, uint32_t ctx, uint64_t len);
int msg_alloc_data(erdma_msg *m);    /* m->data for m->len bytes; 0 or -1 */
void msg_free(erdma_msg *m);
void msgbuf_trim(void);              /* the pooled payload buffers back to malloc */
void bind_recv(erdma_engine *e, erdma_req *r, erdma_msg *m);
int recv_prepare(erdma_req *r, int src, int tag, uint64_t len);
void recv_finish(erdma_req *r);
void engine_fail_peer(erdma_engine *e, int peer, int error);
void rndv_recv_unlink(erdma_engine *e, erdma_req *r); /* off e->rndv_recv, if on it */

#endif /* ERDMA_MATCH_H */
