/*
 * erdma_sched.c - run a schedule of chunked send/recv/reduce/copy steps.
 *
 * A collective algorithm (built once in Python, erdmampi/collectives/
 * sched.py) becomes a list of steps with dependencies; this executor posts
 * each chunk of each step as soon as its dependencies are met and harvests
 * completions, so the per-chunk loop of a large collective runs here and
 * not in the interpreter.  It uses only the public p2p API (erdma_isend,
 * erdma_irecv, erdma_req_*), so it runs over any transport of the engine.
 *
 * Scheduling rules (see erdma.h): steps belong to rounds (erdma_sched_
 * barrier); a chunk may start when its round is current and its
 * dependencies are met; the chunks of a send or recv step are posted in
 * order, at most SCHED_WINDOW of them in flight.  Local steps (reduce,
 * copy) run in the executing thread while the engine moves data.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "erdma.h"
#include "erdma_copy.h"

#define SCHED_WINDOW 8

enum { ST_SEND, ST_RECV, ST_REDUCE, ST_COPY };
enum { S_BUILT, S_RUNNING, S_DONE };

typedef struct {
  int on;
  int chunkwise;
} sched_dep;

typedef struct {
  int kind;
  int round;
  const char *src; /* send buffer, reduce `in`, copy source */
  char *dst;       /* recv buffer, reduce `inout`, copy destination */
  uint64_t nbytes;
  int peer, tag;
  uint32_t ctx;
  int op, dtype, esize;
  int nchunks;
  int next;     /* next chunk to start */
  int ndone;
  int inflight; /* posted requests not yet completed */
  uint8_t *done;
  sched_dep *deps;
  int ndeps, capdeps;
} sched_step;

struct erdma_sched {
  erdma_engine *e;
  uint64_t chunk;
  sched_step *steps;
  int n, cap;
  int round;       /* round of the steps being added */
  int *round_left; /* incomplete steps per round */
  int cur_round;
  int remaining;
  /* posted requests */
  erdma_req **reqs;
  int *req_step, *req_chunk;
  int nreqs, capreqs;
  /* worker */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int has_thread, joined;
  int state, result;
};

/* ------------------------------------------------------------- building */
int erdma_sched_new(erdma_engine *e, uint64_t chunk, erdma_sched **out) {
  if (!e || !out) return ERDMA_ERR_INVAL;
  if (chunk == 0) chunk = ERDMA_SCHED_DEFAULT_CHUNK;
  chunk = (chunk + 63) & ~(uint64_t)63;
  erdma_sched *s = calloc(1, sizeof *s);
  if (!s) return ERDMA_ERR_NOMEM;
  s->e = e;
  s->chunk = chunk;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  *out = s;
  return 0;
}

static int add_step(erdma_sched *s, int kind, const void *src, void *dst,
                    uint64_t nbytes, int esize) {
  if (!s || s->state != S_BUILT) return s ? ERDMA_ERR_STATE : ERDMA_ERR_INVAL;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    sched_step *p = realloc(s->steps, (size_t)cap * sizeof *p);
    if (!p) return ERDMA_ERR_NOMEM;
    s->steps = p;
    s->cap = cap;
  }
  sched_step *st = &s->steps[s->n];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->round = s->round;
  st->src = src;
  st->dst = dst;
  st->nbytes = nbytes;
  st->esize = esize;
  uint64_t nch = (nbytes + s->chunk - 1) / s->chunk;
  if (nch > 0x7fffffff) return ERDMA_ERR_INVAL;
  st->nchunks = (int)nch;
  if (nch) {
    st->done = calloc(nch, 1);
    if (!st->done) return ERDMA_ERR_NOMEM;
  }
  return s->n++;
}

static int add_p2p(erdma_sched *s, int kind, const void *sbuf, void *rbuf, uint64_t nbytes,
                   int peer, int tag, uint32_t ctx) {
  if (nbytes && !sbuf && !rbuf) return ERDMA_ERR_INVAL;
  int i = add_step(s, kind, sbuf, rbuf, nbytes, 1);
  if (i >= 0) {
    s->steps[i].peer = peer;
    s->steps[i].tag = tag;
    s->steps[i].ctx = ctx;
  }
  return i;
}

int erdma_sched_send(erdma_sched *s, const void *buf, uint64_t nbytes, int dest,
                     int tag, uint32_t ctx) {
  return add_p2p(s, ST_SEND, buf, NULL, nbytes, dest, tag, ctx);
}

int erdma_sched_recv(erdma_sched *s, void *buf, uint64_t nbytes, int source,
                     int tag, uint32_t ctx) {
  return add_p2p(s, ST_RECV, NULL, buf, nbytes, source, tag, ctx);
}

int erdma_sched_reduce(erdma_sched *s, const void *in, void *inout,
                       uint64_t count, int op, int dtype) {
  int esize = erdma_dtype_size(dtype);
  if (!esize || erdma_reduce_local(NULL, NULL, 0, op, dtype) != 0)
    return ERDMA_ERR_INVAL;
  if (count && (!in || !inout)) return ERDMA_ERR_INVAL;
  int i = add_step(s, ST_REDUCE, in, inout, count * (uint64_t)esize, esize);
  if (i >= 0) {
    s->steps[i].op = op;
    s->steps[i].dtype = dtype;
  }
  return i;
}

int erdma_sched_copy(erdma_sched *s, const void *src, void *dst, uint64_t nbytes) {
  if (nbytes && (!src || !dst)) return ERDMA_ERR_INVAL;
  return add_step(s, ST_COPY, src, dst, nbytes, 1);
}

int erdma_sched_after(erdma_sched *s, int step, int on, int chunkwise) {
  if (!s || step < 0 || step >= s->n || on < 0 || on >= step) return ERDMA_ERR_INVAL;
  if (s->state != S_BUILT) return ERDMA_ERR_STATE;
  sched_step *st = &s->steps[step];
  if (st->ndeps == st->capdeps) {
    int cap = st->capdeps ? 2 * st->capdeps : 4;
    sched_dep *p = realloc(st->deps, (size_t)cap * sizeof *p);
    if (!p) return ERDMA_ERR_NOMEM;
    st->deps = p;
    st->capdeps = cap;
  }
  st->deps[st->ndeps].on = on;
  st->deps[st->ndeps].chunkwise = chunkwise != 0;
  st->ndeps++;
  return 0;
}

int erdma_sched_barrier(erdma_sched *s) {
  if (!s) return ERDMA_ERR_INVAL;
  if (s->state != S_BUILT) return ERDMA_ERR_STATE;
  if (s->n && s->steps[s->n - 1].round == s->round) s->round++;
  return 0;
}

int erdma_sched_nsteps(erdma_sched *s) { return s ? s->n : 0; }

/* ------------------------------------------------------------- executing */
static void step_progress(erdma_sched *s, sched_step *st, int c) {
  st->done[c] = 1;
  if (++st->ndone == st->nchunks) {
    s->remaining--;
    s->round_left[st->round]--;
    while (s->cur_round <= s->round && s->round_left[s->cur_round] == 0)
      s->cur_round++;
  }
}

static int chunk_ready(const erdma_sched *s, const sched_step *st, int c) {
  for (int k = 0; k < st->ndeps; k++) {
    const sched_step *o = &s->steps[st->deps[k].on];
    if (o->nchunks == 0) continue;
    if (st->deps[k].chunkwise) {
      if (!o->done[c < o->nchunks ? c : o->nchunks - 1]) return 0;
    } else if (o->ndone < o->nchunks) {
      return 0;
    }
  }
  return 1;
}

static int post_chunk(erdma_sched *s, int i, int c) {
  sched_step *st = &s->steps[i];
  uint64_t off = (uint64_t)c * s->chunk;
  uint64_t len = st->nbytes - off < s->chunk ? st->nbytes - off : s->chunk;
  if (st->kind == ST_REDUCE) {
    int rc = erdma_reduce_local(st->src + off, st->dst + off, len / st->esize,
                                st->op, st->dtype);
    if (rc) return rc;
    step_progress(s, st, c);
    return 0;
  }
  if (st->kind == ST_COPY) {
    erdma_move(st->dst + off, st->src + off, len);
    step_progress(s, st, c);
    return 0;
  }
  if (s->nreqs == s->capreqs) {
    int cap = s->capreqs ? 2 * s->capreqs : 32;
    erdma_req **r = realloc(s->reqs, (size_t)cap * sizeof *r);
    if (!r) return ERDMA_ERR_NOMEM;
    s->reqs = r;
    int *a = realloc(s->req_step, (size_t)cap * sizeof *a);
    if (!a) return ERDMA_ERR_NOMEM;
    s->req_step = a;
    int *b = realloc(s->req_chunk, (size_t)cap * sizeof *b);
    if (!b) return ERDMA_ERR_NOMEM;
    s->req_chunk = b;
    s->capreqs = cap;
  }
  erdma_req *r = NULL;
  int rc = st->kind == ST_SEND
               ? erdma_isend(s->e, st->src + off, len, st->peer, st->tag, st->ctx, 0, &r)
               : erdma_irecv(s->e, st->dst + off, len, st->peer, st->tag, st->ctx, 0, &r);
  if (rc) return rc;
  s->reqs[s->nreqs] = r;
  s->req_step[s->nreqs] = i;
  s->req_chunk[s->nreqs] = c;
  s->nreqs++;
  st->inflight++;
  return 0;
}

/* Start every chunk that can start; returns how many started, or an error. */
static int post_ready(erdma_sched *s) {
  int started = 0;
  for (int i = 0; i < s->n; i++) {
    sched_step *st = &s->steps[i];
    if (st->round > s->cur_round) break;
    int net = st->kind == ST_SEND || st->kind == ST_RECV;
    while (st->next < st->nchunks && (!net || st->inflight < SCHED_WINDOW) &&
           chunk_ready(s, st, st->next)) {
      int rc = post_chunk(s, i, st->next++);
      if (rc) return rc;
      started++;
    }
  }
  return started;
}

/* Collect completed requests; returns the first error, else 0. */
static int harvest(erdma_sched *s) {
  int err = 0;
  for (int k = 0; k < s->nreqs;) {
    int done = 0;
    erdma_status st;
    erdma_req_test(s->reqs[k], &done, &st);
    if (!done) {
      k++;
      continue;
    }
    if (st.error && !err) err = st.error;
    erdma_req_free(s->reqs[k]);
    sched_step *step = &s->steps[s->req_step[k]];
    step->inflight--;
    step_progress(s, step, s->req_chunk[k]);
    s->nreqs--;
    s->reqs[k] = s->reqs[s->nreqs];
    s->req_step[k] = s->req_step[s->nreqs];
    s->req_chunk[k] = s->req_chunk[s->nreqs];
  }
  return err;
}

static void abandon(erdma_sched *s) {
  for (int k = 0; k < s->nreqs; k++) {
    erdma_req_abort(s->reqs[k]); /* its buffers may be freed once we return */
    erdma_req_free(s->reqs[k]);
  }
  s->nreqs = 0;
}

static int execute(erdma_sched *s) {
  s->round_left = calloc((size_t)s->round + 1, sizeof(int));
  if (!s->round_left) return ERDMA_ERR_NOMEM;
  s->remaining = 0;
  for (int i = 0; i < s->n; i++)
    if (s->steps[i].nchunks) {
      s->round_left[s->steps[i].round]++;
      s->remaining++;
    }
  s->cur_round = 0;
  while (s->cur_round <= s->round && s->round_left[s->cur_round] == 0) s->cur_round++;
  while (s->remaining > 0) {
    int started = post_ready(s);
    if (started < 0) {
      abandon(s);
      return started;
    }
    if (s->nreqs == 0) {
      if (started) continue;
      return ERDMA_ERR_STATE; /* nothing can ever start: a bad dependency */
    }
    if (!started) {
      int idx;
      int rc = erdma_req_waitany(s->reqs, s->nreqs, -1.0, &idx);
      if (rc) {
        abandon(s);
        return rc;
      }
    }
    int err = harvest(s);
    if (err) {
      abandon(s);
      return err;
    }
  }
  return 0;
}

/* Run the steps, then publish the result to waiters. */
static int execute_and_finish(erdma_sched *s) {
  int rc = execute(s);
  pthread_mutex_lock(&s->mu);
  s->result = rc;
  s->state = S_DONE;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int erdma_sched_run(erdma_sched *s) {
  if (!s) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&s->mu);
  if (s->state != S_BUILT) {
    pthread_mutex_unlock(&s->mu);
    return ERDMA_ERR_STATE;
  }
  s->state = S_RUNNING;
  pthread_mutex_unlock(&s->mu);
  return execute_and_finish(s);
}

static void *worker(void *arg) {
  execute_and_finish(arg);
  return NULL;
}

int erdma_sched_start(erdma_sched *s) {
  if (!s) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&s->mu);
  if (s->state != S_BUILT) {
    pthread_mutex_unlock(&s->mu);
    return ERDMA_ERR_STATE;
  }
  s->state = S_RUNNING;
  int rc = pthread_create(&s->thread, NULL, worker, s);
  if (rc) {
    s->state = S_BUILT;
    pthread_mutex_unlock(&s->mu);
    return ERDMA_ERR_NOMEM;
  }
  s->has_thread = 1;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static void join_worker(erdma_sched *s) {
  /* called with s->mu held and state == S_DONE */
  if (s->has_thread && !s->joined) {
    s->joined = 1;
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
  }
}

int erdma_sched_wait(erdma_sched *s, double timeout) {
  if (!s) return ERDMA_ERR_INVAL;
  struct timespec until;
  if (timeout >= 0) {
    clock_gettime(CLOCK_REALTIME, &until);
    double t = until.tv_sec + until.tv_nsec * 1e-9 + timeout;
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  }
  pthread_mutex_lock(&s->mu);
  if (s->state == S_BUILT) {
    pthread_mutex_unlock(&s->mu);
    return ERDMA_ERR_STATE;
  }
  while (s->state != S_DONE) {
    if (timeout < 0) {
      pthread_cond_wait(&s->cv, &s->mu);
    } else if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT &&
               s->state != S_DONE) {
      pthread_mutex_unlock(&s->mu);
      return ERDMA_ERR_TIMEOUT;
    }
  }
  join_worker(s);
  int rc = s->result;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int erdma_sched_test(erdma_sched *s, int *done) {
  if (!s || !done) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&s->mu);
  *done = s->state == S_DONE;
  int rc = 0;
  if (*done) {
    join_worker(s);
    rc = s->result;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void erdma_sched_free(erdma_sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  int running = s->state != S_BUILT;
  pthread_mutex_unlock(&s->mu);
  if (running) erdma_sched_wait(s, -1.0);
  for (int i = 0; i < s->n; i++) {
    free(s->steps[i].done);
    free(s->steps[i].deps);
  }
  free(s->steps);
  free(s->round_left);
  free(s->reqs);
  free(s->req_step);
  free(s->req_chunk);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}
