/* erdma_pyfast.c - CPython entry points for the blocking point-to-point fast
 * path: Comm.Send / Comm.Recv (and a small Comm.Allreduce) of buffers the
 * communicator remembers.
 *
 * cffi's generic call costs about as much as an eager shared-memory send
 * itself (argument conversion, a tuple, the GIL dance), and the Python
 * checks around it twice that.  Here one C call checks the spec (by
 * identity against the remembered one), the rank and the tag, and runs
 * erdma_send / erdma_recv with the GIL released.  Everything it does not
 * know answers "miss" (1) and Python takes the normal path, which parses the
 * spec and may remember it (`remember`).
 *
 * erdma_pyfast_init(name) makes the module `name` (erdmampi._erdma_fast):
 *   new(engine_addr, owner, ctx, ranks, me, tag_ub, slice, seq) -> state (a
 *     capsule; seq: the communicator's collective call counter, an iterator)
 *   remember(state, recv, spec, arr, dt, flags[, weak, count]) -> bool
 *   send(state, buf, dest, tag) / recv(state, buf, source, tag) (also of
 *     bytes to send and bytearray both ways, never remembered) ->
 *     0 done; 1 miss (nothing done); a negative ERDMA error the operation
 *     completed with; or (rc, left): erdma_send/erdma_recv's own error, with
 *     left the address of the request still pending after `slice` seconds
 *     (ERDMA_ERR_TIMEOUT) or 0.
 *   recv_status(state, buf, source, tag): as recv, but a completed receive
 *     answers (error, world source, tag, nbytes)
 *   sendrecv(state, sendbuf, dest, sendtag, recvbuf, source, recvtag): both
 *     remembered specs in one call (see pf_sendrecv); remember_packed(...)
 *     remembers a `[array, count, derived datatype]` side for it;
 *     sendrecv_replace(state, buf, dest, sendtag, source, recvtag) the same
 *     with one buffer, when the message goes into a local peer's ring
 *   isend(state, buf, dest, tag) / irecv(state, buf, source, tag, index):
 *     an Op (a Request's operation) for Comm.Isend / Comm.Irecv (see
 *     pf_isend); configure(...) sets what Ops report errors with
 *   remember_allreduce(...) / allreduce(state, sendbuf, recvbuf, op): the
 *     same for a small Allreduce (erdma_coll_allreduce), answering 0, 1 or
 *     (rc, pending): the collective still pending after `slice` seconds.
 *   remember_bcast(...) / bcast(state, buf, root), remember_barrier(...) /
 *     barrier(state), remember_alltoall(...) / alltoall(state, sendbuf,
 *     recvbuf), remember_allgather / allgather and remember_reduce_scatter
 *     / reduce_scatter (as allreduce): the same for the binomial Bcast
 *     (erdma_coll_bcast), the dissemination Barrier (erdma_coll_barrier),
 *     the direct Alltoall and Allgather (erdma_coll_alltoall,
 *     erdma_coll_allgather) and the ring Reduce_scatter_block
 *     (erdma_coll_reduce_scatter).
 *   remember_rooted(...) / rooted(state, which, sendbuf, recvbuf, root, op):
 *     the same for the linear Gather and Scatter and the binomial Reduce
 *     (erdma_coll_gather, _scatter, _reduce; see pf_remember_rooted).
 *   send_bytes(state, data, dest, tag[, base]) / recv_bytes(state, source,
 *     tag[, base]): a pickled object (the lowercase send / recv; with base,
 *     a message of an object collective), see below; send_obj(state, obj,
 *     dest, tag, wire[, base]) also pickles, recv_obj(state, source, tag,
 *     loads[, base]) also unpickles an in-band pickle, and pair_obj(...)
 *     makes a two-rank object collective of them (see pf_pair_obj)
 * erdma_pyfast_invalidate() retires every state (engine shutdown): they miss.
 *
 * Limited API 3.11 (the module is abi3); older Pythons get no module and
 * keep the normal path. */
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030B0000
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#endif
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "erdma.h"
#include "erdma_copy.h"

static volatile unsigned pyfast_epoch = 1;

void erdma_pyfast_invalidate(void) { __atomic_add_fetch(&pyfast_epoch, 1, __ATOMIC_SEQ_CST); }

#if PY_VERSION_HEX >= 0x030B0000

/* numpy's array object starts with these fields (its C ABI, unchanged since
 * numpy 1.7, read by PyArray_FLAGS in every compiled extension); `remember`
 * checks that the flags read here are the ones Python saw before using it. */
typedef struct {
  PyObject_HEAD
  char *data;
  int nd;
  intptr_t *dimensions, *strides;
  PyObject *base, *descr;
  int flags;
} np_head;

#define NP_C_CONTIGUOUS 0x0001
#define NP_WRITEABLE 0x0400

/* Is `o` another array object over the memory of the remembered `arr` (a
 * fresh view `b[:n]` each call): the same type, data pointer, shape,
 * strides and dtype object?  Its own flags are the caller's to check. */
static int same_array(PyObject *o, PyObject *arr) {
  if (!arr || Py_TYPE(o) != Py_TYPE(arr)) return 0;
  const np_head *a = (const np_head *)o, *b = (const np_head *)arr;
  if (a->data != b->data || a->nd != b->nd || a->descr != b->descr) return 0;
  for (int i = 0; i < a->nd; i++)
    if (a->dimensions[i] != b->dimensions[i] || a->strides[i] != b->strides[i]) return 0;
  return 1;
}

/* An array's layout as a remembered call saw it: its type and dtype object
 * (held, so that their addresses stay theirs), shape and strides (up to
 * PF_ND dimensions).  Not its memory: a program that passes a new array of
 * the same layout every call (`comm.Allreduce(np.array([x]), out)`) gets
 * the one-call path too; each call exports the array it passes. */
#define PF_ND 8
typedef struct {
  PyObject *type, *descr; /* NULL: none kept */
  int nd;
  intptr_t dims[PF_ND], strides[PF_ND];
} pf_layout;

static int layout_keep(pf_layout *l, PyObject *arr) {
  const np_head *a = (const np_head *)arr;
  if (a->nd < 0 || a->nd > PF_ND) return 0;
  l->type = Py_NewRef((PyObject *)Py_TYPE(arr));
  l->descr = Py_NewRef(a->descr);
  l->nd = a->nd;
  for (int i = 0; i < a->nd; i++) {
    l->dims[i] = a->dimensions[i];
    l->strides[i] = a->strides[i];
  }
  return 1;
}

static void layout_clear(pf_layout *l) {
  Py_CLEAR(l->type);
  Py_CLEAR(l->descr);
}

/* Is `o` an array of that layout (whichever object, wherever its memory)? */
static int layout_is(const pf_layout *l, PyObject *o) {
  if (!l->type || (PyObject *)Py_TYPE(o) != l->type) return 0;
  const np_head *a = (const np_head *)o;
  if (a->nd != l->nd || a->descr != l->descr) return 0;
  for (int i = 0; i < a->nd; i++)
    if (a->dimensions[i] != l->dims[i] || a->strides[i] != l->strides[i]) return 0;
  return 1;
}

typedef struct {
  PyObject *spec, *arr, *dt; /* dt NULL: spec is the array itself */
  Py_buffer view;            /* an export of arr: its memory stays put */
  int have, busy;
  int need;                  /* flag bits arr must still have */
  /* remember's `weak`: any array of this layout (one too large to keep
   * alive, or a small one's layout beside its own entry, for programs that
   * pass new arrays): spec, arr and view are not kept; a call finds its
   * array in the spec it is given, checks it against this layout and
   * exports it for the call (pf_mem) */
  int weak;
  pf_layout l;
  long count; /* with dt: the count an [arr, count, dt] spec gives (0: none) */
  unsigned long used; /* the state's tick when last remembered or matched */
} pf_entry;

/* The memory one call moves for a remembered entry: the entry's own
 * export, or for a weak one an export of the array the spec holds now,
 * released by mem_done. */
typedef struct {
  void *buf;
  uint64_t len;
  Py_buffer view;
  int exported;
} pf_mem;

static void mem_done(pf_mem *m) {
  if (m->exported) PyBuffer_Release(&m->view);
  m->exported = 0;
}

/* A remembered small Allreduce: its specs (sspec is MPI.IN_PLACE when sarr
 * is NULL), op, C codes, and what decided that it runs uncompressed in one
 * engine call: no ERDMA_COLL_ALLREDUCE in os.environ (env, envkey), the
 * compression mode (cfg.mode is mode) and no communicator hints. */
typedef struct {
  int have, busy;
  PyObject *sspec, *sarr, *sdt, *rspec, *rarr, *rdt, *op;
  PyObject *env, *envkey, *cfg, *mode, *hints;
  Py_buffer sview, rview;
  uint64_t count;
  int opc, dtc;
  /* rooted calls (remember_rooted): the root, and what each side is: 0 not
   * used at this rank (not checked), 1 MPI.IN_PLACE (the spec itself), 2 an
   * array (sarr/rarr), 3 any array of the layout sl/rl (remembered weak) */
  int root, smode, rmode;
  /* arrays too large to keep alive, or made anew by the program for every
   * call (remember_* with `weak`): sarr, rarr and
   * their specs are not held (NULL; sspec stays for MPI.IN_PLACE) and not
   * exported; each call finds its arrays in the specs passed, checks them
   * against these layouts and exports them for the call's duration */
  int weak;
  pf_layout sl, rl;
  int kind;    /* 0: erdma_coll_*; 1: erdma_coll_alltoall_bulk / _allgather_bulk /
                * _allreduce_pair / _reduce_scatter_pair (erdma_bulk.c) */
  double part; /* the bulk Alltoall's pull_part */
} pf_coll;

#define PF_SLOTS 8

/* Of two remembered slots, is (have, used) replaced before (xhave, xused)?
 * An empty one first, then the one least recently used. */
static int evicts_before(int have, unsigned long used, int xhave, unsigned long xused) {
  return !have ? xhave : xhave && used < xused;
}

/* A `[array, count, derived datatype]` side of a Sendrecv (a halo
 * exchange).  Python (comm_p2p._packed_side) keeps per spec the packing
 * plan and a temporary of the packed bytes in a tuple `ent` = (arr, dt,
 * rec, nbytes, plan, tmp); remember_packed hands it here with the plan's
 * numbers.  A side matches by its items, since a halo builds its lists
 * anew each call: the same array object, count and datatype object, the
 * datatype's record (dt._r, replaced when it is freed) unchanged, and the
 * array's layout and flags as remembered. */
typedef struct {
  PyObject *arr, *dt, *rec, *ent; /* held */
  long count;
  pf_layout l;
  int need, have, busy;
  unsigned long used; /* as pf_entry's */
  uint64_t n, nruns, total;
  int64_t step;
  const int64_t *off, *ln; /* the plan's arrays (ent holds the plan) */
  Py_buffer tmp;           /* an export of ent's temporary */
} pf_packed;

typedef struct {
  erdma_engine *e;
  PyObject *owner; /* the engine's Python wrapper: keeps the engine alive */
  PyObject *seq;   /* the communicator's collective call counter (an iterator) */
  unsigned epoch;
  uint32_t ctx;
  int size, me;
  long tag_ub;
  double slice;
  /* remembered specs, [0]: send, [1]: recv; PF_SLOTS each (a halo exchange
   * cycles through a few buffers).  A new one replaces the one least
   * recently used, so that buffers a program passes once (a new array for
   * an Irecv) do not push out the ones it passes every time, whatever the
   * order of its calls and misses. */
  pf_entry ent[2][PF_SLOTS];
  pf_entry raw;                /* entry_for's for bytes and bytearray: never remembered
                                * (its busy count unused) */
  unsigned long tick; /* counts matches and remembers, for `used` */
  pf_coll ar, rs, bc, a2a, ag; /* Allreduce, Reduce_scatter_block; Bcast (its buffer
                                  as the receive side); Alltoall, Allgather */
  pf_coll rooted[3];           /* Gather, Scatter, Reduce (remember_rooted) */
  PyObject *bar_env, *bar_key; /* Barrier: remembered when both set */
  int pair;                    /* two ranks: the Barrier's flag slot (erdma_pair_*), or -1 */
  unsigned pair_gen;           /* erdma_pair_gen when `pair` was looked up */
  int pair_refused;            /* offers the peer did not take (none past PAIR_OFFERS) */
  pf_packed pk[2][PF_SLOTS];   /* packed Sendrecv sides, [0]: send, [1]: recv */
  unsigned long hits; /* Sendrecv, Isend, Irecv calls run here (see hits()) */
  int *inv, ninv;     /* world rank -> rank (comm_rank), made on first use */
  /* the C methods' pickling arguments (meth_extra 1 and 2) as read last,
   * valid while pkl_gen is pickle_gen (pickle_changed()) */
  PyObject *pkl_wire, *pkl_loads;
  unsigned long pkl_gen;
  /* meth_extra 4 as read first: a communicator's group changes only with
   * a new state (Comm._setup, Free: _fast None) */
  PyObject *gindex;
  int ranks[];
} pf_state;

#define SEQ_MOD (1L << 20) /* erdmampi.comm: _SEQ_MOD, _COLL_TAGS */
#define PAIR_OFFERS 3      /* two-rank Barrier flags offered per communicator state */
#define COLL_TAGS 1024

static const char CAPSULE[] = "erdmampi._erdma_fast.state";

static void entry_clear(pf_entry *x) {
  if (!x->have) return;
  x->have = 0;
  if (x->weak) {
    x->weak = 0;
    layout_clear(&x->l);
    Py_CLEAR(x->dt);
    return;
  }
  PyBuffer_Release(&x->view);
  Py_CLEAR(x->spec);
  Py_CLEAR(x->arr);
  Py_CLEAR(x->dt);
}

static void packed_clear(pf_packed *x) {
  if (!x->have) return;
  x->have = 0;
  PyBuffer_Release(&x->tmp);
  layout_clear(&x->l);
  Py_CLEAR(x->arr);
  Py_CLEAR(x->dt);
  Py_CLEAR(x->rec);
  Py_CLEAR(x->ent);
}

static void coll_clear(pf_coll *x) {
  if (!x->have) return;
  x->have = 0;
  if (x->sarr) PyBuffer_Release(&x->sview);
  if (x->rarr) PyBuffer_Release(&x->rview);
  layout_clear(&x->sl);
  layout_clear(&x->rl);
  Py_CLEAR(x->sspec);
  Py_CLEAR(x->sarr);
  Py_CLEAR(x->sdt);
  Py_CLEAR(x->rspec);
  Py_CLEAR(x->rarr);
  Py_CLEAR(x->rdt);
  Py_CLEAR(x->op);
  Py_CLEAR(x->env);
  Py_CLEAR(x->envkey);
  Py_CLEAR(x->cfg);
  Py_CLEAR(x->mode);
  Py_CLEAR(x->hints);
}

static void state_free(PyObject *cap) {
  pf_state *s = PyCapsule_GetPointer(cap, CAPSULE);
  if (!s) return;
  for (int d = 0; d < 2; d++)
    for (int i = 0; i < PF_SLOTS; i++) {
      entry_clear(&s->ent[d][i]);
      packed_clear(&s->pk[d][i]);
    }
  coll_clear(&s->ar);
  coll_clear(&s->bc);
  coll_clear(&s->a2a);
  coll_clear(&s->ag);
  coll_clear(&s->rs);
  for (int i = 0; i < 3; i++) coll_clear(&s->rooted[i]);
  Py_XDECREF(s->bar_env);
  Py_XDECREF(s->bar_key);
  Py_XDECREF(s->pkl_wire);
  Py_XDECREF(s->pkl_loads);
  Py_XDECREF(s->gindex);
  Py_XDECREF(s->owner);
  Py_XDECREF(s->seq);
  free(s->inv);
  free(s);
}

static pf_state *state_of(PyObject *cap) {
  if (cap == Py_None) return NULL;
  pf_state *s = PyCapsule_GetPointer(cap, CAPSULE);
  if (!s) {
    PyErr_Clear();
    return NULL;
  }
  return s->epoch == pyfast_epoch ? s : NULL;
}

/* new(engine_addr, owner, ctx, ranks, me, tag_ub, slice, seq) */
static PyObject *pf_new(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 8) {
    PyErr_SetString(PyExc_TypeError, "new() takes 8 arguments");
    return NULL;
  }
  void *e = PyLong_AsVoidPtr(args[0]);
  unsigned long ctx = PyLong_AsUnsignedLong(args[2]);
  long me = PyLong_AsLong(args[4]);
  long tag_ub = PyLong_AsLong(args[5]);
  double slice = PyFloat_AsDouble(args[6]);
  if (PyErr_Occurred()) return NULL;
  if (!PyIter_Check(args[7])) {
    PyErr_SetString(PyExc_TypeError, "new(): seq must be an iterator");
    return NULL;
  }
  PyObject *seq = PySequence_Tuple(args[3]);
  if (!seq) return NULL;
  Py_ssize_t size = PyTuple_Size(seq);
  pf_state *s = calloc(1, sizeof *s + sizeof(int) * (size_t)(size > 0 ? size : 1));
  if (!s) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < size; i++) {
    s->ranks[i] = (int)PyLong_AsLong(PyTuple_GetItem(seq, i));
    if (PyErr_Occurred()) {
      Py_DECREF(seq);
      free(s);
      return NULL;
    }
  }
  Py_DECREF(seq);
  s->e = e;
  s->owner = Py_NewRef(args[1]);
  s->seq = Py_NewRef(args[7]);
  s->me = (int)me;
  s->epoch = pyfast_epoch;
  s->ctx = (uint32_t)ctx;
  s->size = (int)size;
  s->tag_ub = tag_ub;
  s->slice = slice;
  s->pair = -1;
  PyObject *cap = PyCapsule_New(s, CAPSULE, state_free);
  if (!cap) {
    Py_DECREF(s->owner);
    Py_DECREF(s->seq);
    free(s);
  }
  return cap;
}

/* remember(state, recv, spec, arr, dt, flags[, weak, count]): arr (a
 * numpy.ndarray that Python found plain, whole and C-contiguous, writeable
 * for a receive) is what `spec` means; flags is arr.flags.num as Python saw
 * it.  With weak true, by the array's layout alone (see pf_entry).  count:
 * the count of dt elements that covers arr, with which an [arr, count, dt]
 * spec means the same (0: such specs are not this entry's). */
static PyObject *pf_remember(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n < 6 || n > 8) {
    PyErr_SetString(PyExc_TypeError, "remember() takes 6 to 8 arguments");
    return NULL;
  }
  int weak = n >= 7 ? PyObject_IsTrue(args[6]) : 0;
  if (weak < 0) return NULL;
  long count = n == 8 ? PyLong_AsLong(args[7]) : 0;
  if (count < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "remember(): a negative count");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  int recv = PyObject_IsTrue(args[1]);
  long flags = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return NULL;
  PyObject *spec = args[2], *arr = args[3], *dt = args[4] == Py_None ? NULL : args[4];
  if (!s || recv < 0) Py_RETURN_FALSE;
  int need = NP_C_CONTIGUOUS | (recv ? NP_WRITEABLE : 0);
  /* the layout above is numpy's (else never read it) */
  if (((np_head *)arr)->flags != (int)flags || (flags & need) != need) Py_RETURN_FALSE;
  /* the slot of this spec, else the least recently used one that no
   * thread is sending from or receiving into right now */
  pf_entry *x = NULL;
  for (int i = 0; i < PF_SLOTS && !x; i++) {
    pf_entry *y = &s->ent[recv][i];
    if (y->have && (weak ? y->weak && y->dt == dt && y->count == count && layout_is(&y->l, arr)
                         : !y->weak && (y->spec == spec || (y->arr == arr && y->dt == dt &&
                                                            y->count == count))))
      x = y;
  }
  if (!x) /* a new one: the slot to replace */
    for (int i = 0; i < PF_SLOTS; i++) {
      pf_entry *y = &s->ent[recv][i];
      if (!y->busy && (!x || evicts_before(y->have, y->used, x->have, x->used))) x = y;
    }
  if (!x || x->busy) Py_RETURN_FALSE;
  x->used = ++s->tick;
  if (weak) {
    entry_clear(x);
    if (!layout_keep(&x->l, arr)) Py_RETURN_FALSE;
    x->dt = dt ? Py_NewRef(dt) : NULL;
    x->count = dt ? count : 0;
    x->need = need;
    x->weak = x->have = 1;
    Py_RETURN_TRUE;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(arr, &view, recv ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  entry_clear(x);
  x->view = view;
  x->spec = Py_NewRef(spec);
  x->arr = Py_NewRef(arr);
  x->dt = dt ? Py_NewRef(dt) : NULL;
  x->count = dt ? count : 0;
  x->need = need;
  x->have = 1;
  Py_RETURN_TRUE;
}

/* `spec` as [array, datatype] (a list or tuple): its items (borrowed) in
 * *a and *d, *count -1; or [array, count, datatype]: *count the count if it
 * is an exact int >= 0, else -2.  0 for anything else. */
static int spec_items(PyObject *spec, PyObject **a, long *count, PyObject **d) {
  Py_ssize_t n;
  PyObject *c = NULL;
  if (PyList_CheckExact(spec) && ((n = PyList_Size(spec)) == 2 || n == 3)) {
    *a = PyList_GetItem(spec, 0);
    if (n == 3) c = PyList_GetItem(spec, 1);
    *d = PyList_GetItem(spec, n - 1);
  } else if (PyTuple_CheckExact(spec) && ((n = PyTuple_Size(spec)) == 2 || n == 3)) {
    *a = PyTuple_GetItem(spec, 0);
    if (n == 3) c = PyTuple_GetItem(spec, 1);
    *d = PyTuple_GetItem(spec, n - 1);
  } else {
    return 0;
  }
  *count = -1;
  if (c) {
    *count = PyLong_CheckExact(c) ? PyLong_AsLong(c) : -2;
    if (*count < 0) {
      PyErr_Clear();
      *count = -2;
    }
  }
  return 1;
}

/* `spec` as [array, datatype] alone (see spec_items). */
static int spec_pair(PyObject *spec, PyObject **a, PyObject **d) {
  long count;
  return spec_items(spec, a, &count, d) && count == -1;
}

/* Do the items of a spec (spec_items) give entry y's datatype and count? */
static int entry_dt_is(const pf_entry *y, PyObject *d, long count) {
  return d == y->dt && (count == -1 || (y->count > 0 && count == y->count));
}

/* Export obj's memory for one call into m (writable for a receive): 1, or
 * 0 (no error set) when it cannot be. */
static int mem_export(pf_mem *m, PyObject *obj, int recv) {
  if (PyObject_GetBuffer(obj, &m->view, recv ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    return 0;
  }
  m->exported = 1;
  m->buf = m->view.buf;
  m->len = (uint64_t)m->view.len;
  return 1;
}

/* The remembered entry if `buf` is (still) its spec, else NULL; with m,
 * the memory the call moves (mem_done after it).  Weak entries match only
 * with m. */
static pf_entry *entry_for(pf_state *s, int recv, PyObject *buf, pf_mem *m) {
  pf_entry *x = NULL;
  /* bytes (sent) and bytearray: their own memory, as BYTE, exported for the
   * whole call (an exported bytearray cannot be resized; see raw_wait) */
  if (m && ((!recv && PyBytes_CheckExact(buf)) || PyByteArray_CheckExact(buf)))
    return mem_export(m, buf, recv) ? &s->raw : NULL;
  for (int i = 0; i < PF_SLOTS; i++)
    if (s->ent[recv][i].spec == buf && s->ent[recv][i].have) {
      x = &s->ent[recv][i];
      break;
    }
  PyObject *a = buf, *d = NULL;
  long count = -1;
  int items = spec_items(buf, &a, &count, &d);
  /* a new array object over a remembered array's memory, or a new
   * [array, (count,) datatype] of a remembered one (`comm.Send([buf,
   * MPI.INT], ...)` makes one every call) */
  for (int i = 0; i < PF_SLOTS && !x; i++) {
    pf_entry *y = &s->ent[recv][i];
    if (!y->have || y->weak) continue;
    if (y->dt ? items && a == y->arr && entry_dt_is(y, d, count)
              : same_array(buf, y->arr) && (((np_head *)buf)->flags & y->need) == y->need)
      x = y;
  }
  if (!x && m) { /* by layout: a weak entry */
    for (int i = 0; i < PF_SLOTS && !x; i++) {
      pf_entry *y = &s->ent[recv][i];
      if (y->have && y->weak && (y->dt ? items && entry_dt_is(y, d, count) : !items) &&
          layout_is(&y->l, a) && (((np_head *)a)->flags & y->need) == y->need)
        x = y;
    }
  }
  if (!x || x->busy) return NULL;
  x->used = ++s->tick;
  if (x->weak) return mem_export(m, a, recv) ? x : NULL;
  /* the remembered spec object may have been changed since */
  if (x->dt && !(items && a == x->arr && entry_dt_is(x, d, count))) return NULL;
  if ((((np_head *)x->arr)->flags & x->need) != x->need) return NULL;
  if (m) {
    m->buf = x->view.buf;
    m->len = (uint64_t)x->view.len;
    m->exported = 0;
  }
  return x;
}

/* An exact int in [lo, hi] (else 0, no error set). */
static int small_int(PyObject *o, long lo, long hi, long *out) {
  if (!PyLong_CheckExact(o)) return 0;
  int overflow;
  long v = PyLong_AsLongAndOverflow(o, &overflow);
  if (overflow || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return 0;
  }
  *out = v;
  return v >= lo && v <= hi;
}

static PyObject *result(int rc, const erdma_blocking *out) {
  if (rc == 0) return PyLong_FromLong(out->error);
  return Py_BuildValue("(iK)", rc, (unsigned long long)(uintptr_t)out->left);
}

/* The arguments (state, buf, peer, tag) of a point-to-point call on a
 * remembered spec: 1 with the state, the entry, the peer's world rank
 * (ERDMA_ANY_SOURCE kept) and the tag; 0: a miss.  A send takes a rank and
 * a tag; a receive also ANY_SOURCE and ANY_TAG (MPI's values are the
 * engine's, erdmampi.comm), never -1 (PROC_NULL). */
static int p2p_args(PyObject *const *args, int recv, pf_state **sp, pf_entry **xp, int *peer,
                    long *tag, pf_mem *m) {
  long p;
  pf_state *s = state_of(args[0]);
  if (!s || !small_int(args[2], recv ? ERDMA_ANY_SOURCE : 0, s->size - 1, &p) || p == -1 ||
      !small_int(args[3], recv ? ERDMA_ANY_TAG : 0, s->tag_ub, tag) ||
      !(*xp = entry_for(s, recv, args[1], m)))
    return 0;
  *sp = s;
  *peer = p == ERDMA_ANY_SOURCE ? ERDMA_ANY_SOURCE : s->ranks[p];
  return 1;
}

/* A call on bytes or a bytearray (entry_for's raw entry) still pending
 * after a slice (out->left): wait on here with its memory exported, in
 * slices with signal checks, as erdma_send / erdma_recv's own wait.  Handed
 * to Python with only a reference, a bytearray could be resized under the
 * engine.  A signal's exception withdraws it (erdma_req_abort: a send's
 * bytes are copied first): PF_SIGNALLED.  Else the request's end, as
 * erdma_send / erdma_recv answer it. */
#define PF_SIGNALLED INT32_MIN /* a wait ended by a signal's exception (set) */
static int raw_wait(pf_state *s, erdma_blocking *out) {
  int rc;
  do {
    erdma_req *r = out->left;
    if (PyErr_CheckSignals()) {
      erdma_req_abort(r);
      erdma_req_free(r);
      out->left = NULL;
      return PF_SIGNALLED;
    }
    PyThreadState *ts = PyEval_SaveThread();
    rc = erdma_blocking_wait(r, s->slice, out);
    PyEval_RestoreThread(ts);
  } while (rc == ERDMA_ERR_TIMEOUT);
  return rc;
}

static PyObject *pf_send(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long tag;
  int dest;
  pf_state *s;
  pf_entry *x;
  pf_mem m;
  if (n != 4 || !p2p_args(args, 0, &s, &x, &dest, &tag, &m)) return PyLong_FromLong(1);
  /* an eager message into a local peer's ring never waits: keep the GIL */
  if (erdma_shm_try_send(s->e, m.buf, m.len, dest, (int)tag, s->ctx, 0)) {
    mem_done(&m);
    return PyLong_FromLong(0);
  }
  erdma_blocking out;
  x->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_send(s->e, m.buf, m.len, dest, (int)tag, s->ctx, 0, s->slice, &out);
  PyEval_RestoreThread(ts);
  if (rc == ERDMA_ERR_TIMEOUT && x == &s->raw && out.left) rc = raw_wait(s, &out);
  x->busy--;
  mem_done(&m);
  return rc == PF_SIGNALLED ? NULL : result(rc, &out);
}

static long comm_rank(pf_state *s, int w);
static void status_fill(Py_buffer *v, long source, long tag, uint64_t nbytes);

/* recv; want_status: a completed receive answers (error, world source,
 * tag, nbytes), or, with a status view sv (see status_view) and no error,
 * fills it and answers 0. */
static PyObject *do_recv(PyObject *const *args, Py_ssize_t n, int want_status, Py_buffer *sv) {
  long tag;
  int src;
  pf_state *s;
  pf_entry *x;
  pf_mem m;
  if (n != 4 || !p2p_args(args, 1, &s, &x, &src, &tag, &m)) return PyLong_FromLong(1);
  erdma_blocking out;
  x->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_recv(s->e, m.buf, m.len, src, (int)tag, s->ctx, s->slice, &out);
  PyEval_RestoreThread(ts);
  if (rc == ERDMA_ERR_TIMEOUT && x == &s->raw && out.left) rc = raw_wait(s, &out);
  x->busy--;
  mem_done(&m);
  if (rc == PF_SIGNALLED) return NULL;
  if (rc == 0 && sv && out.error == 0) {
    status_fill(sv, comm_rank(s, out.source), out.tag, out.nbytes);
    return PyLong_FromLong(0);
  }
  if (rc == 0 && want_status)
    return Py_BuildValue("(iiiK)", out.error, out.source, out.tag,
                         (unsigned long long)out.nbytes);
  return result(rc, &out);
}

static PyObject *pf_recv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return do_recv(args, n, 0, NULL);
}

/* recv_status(state, buf, source, tag): as recv, but a completed receive
 * answers (error, world source, tag, nbytes) for the caller's Status. */
static PyObject *pf_recv_status(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return do_recv(args, n, 1, NULL);
}

/* ---- Op: the operation of a Request posted by isend/irecv ----
 * What erdmampi.request expects of an operation (fields, obj, persistent,
 * test, wait, cancel, free), in C: the Python layers of _EngineOp cost more
 * than the message.  Completion frees the engine request; a request dropped
 * while pending is parked (configure's `park`) until the engine is done with
 * its buffer.  Several threads may wait on one: the last one out frees. */
typedef struct {
  PyObject_HEAD
  erdma_req *req;    /* NULL once freed (or parked) */
  PyObject *keep;    /* the buffer spec, alive while the engine may use it */
  PyObject *index;   /* a receive: world rank -> communicator rank; NULL: a send */
  PyObject *fields;  /* (source, tag, error class, nbytes, cancelled) once complete */
  double slice;
  int waiters;
} pf_op;

static PyObject *op_type, *op_errclass, *op_raise, *op_park;
static PyObject *op_done_fields; /* op_done_send's, from configure's constants on first use */
static long op_any_source = -2, op_any_tag = -1, op_undefined = -32766, op_err_other = 16;

/* configure(errclass, raise_engine, park, ANY_SOURCE, ANY_TAG, UNDEFINED,
 * ERR_OTHER): the mapping of ERDMA codes to MPI error classes, raise_engine(
 * code, what) (raises), park(addr, keep) (takes a pending request over) and
 * the constants of statuses. */
static PyObject *pf_configure(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 7 || !PyDict_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "configure() takes a dict and 6 more arguments");
    return NULL;
  }
  long as = PyLong_AsLong(args[3]), at = PyLong_AsLong(args[4]), un = PyLong_AsLong(args[5]),
       eo = PyLong_AsLong(args[6]);
  if (PyErr_Occurred()) return NULL;
  PyObject *old[3] = {op_errclass, op_raise, op_park};
  op_errclass = Py_NewRef(args[0]);
  op_raise = Py_NewRef(args[1]);
  op_park = Py_NewRef(args[2]);
  for (int i = 0; i < 3; i++) Py_XDECREF(old[i]);
  op_any_source = as;
  op_any_tag = at;
  Py_CLEAR(op_done_fields);
  op_undefined = un;
  op_err_other = eo;
  Py_RETURN_NONE;
}

/* ---- a Status filled in C (the methods Recv and Sendrecv) ----
 * erdmampi.status keeps a Status's fields in `_mem`, an array.array of five
 * C ints in MPICH's MPI_Status layout (count low word, count high word << 1
 * | cancelled, source, tag, error).  A receive that completes without error
 * fills them here as Status._fill(source, tag, None, nbytes) does: MPI_ERROR
 * left as it is. */
static PyObject *str_mem;

static PyTypeObject *status_type; /* erdmampi.status.Status (setup) */

/* A writable view of status._mem (1), else 0: Python fills it or raises
 * mpi4py's TypeError (not a Status; no error set here). */
static int status_view(PyObject *status, Py_buffer *v) {
  if (!status_type || !PyObject_TypeCheck(status, status_type)) return 0;
  if (!str_mem && !(str_mem = PyUnicode_InternFromString("_mem"))) {
    PyErr_Clear();
    return 0;
  }
  PyObject *mem = PyObject_GetAttr(status, str_mem);
  if (!mem) {
    PyErr_Clear();
    return 0;
  }
  int ok = PyObject_GetBuffer(mem, v, PyBUF_WRITABLE | PyBUF_FORMAT) == 0;
  Py_DECREF(mem); /* the view holds its own reference */
  if (!ok) {
    PyErr_Clear();
    return 0;
  }
  if (v->len != 5 * (Py_ssize_t)sizeof(int) || v->itemsize != (Py_ssize_t)sizeof(int) ||
      !v->format || strcmp(v->format, "i")) {
    PyBuffer_Release(v);
    return 0;
  }
  return 1;
}

/* A method's `status` argument: 1, with *sv NULL for None or v, a view of
 * the Status's fields, to be released after the call; 0 (a miss): not a
 * Status, which Python refuses as mpi4py does. */
static int status_arg(PyObject *status, Py_buffer *v, Py_buffer **sv) {
  *sv = NULL;
  if (status == Py_None) return 1;
  if (!status_view(status, v)) return 0;
  *sv = v;
  return 1;
}

/* The communicator rank of world rank w (UNDEFINED if not a member): the
 * inverse of s->ranks, made on first use. */
static long comm_rank(pf_state *s, int w) {
  if (w < 0) return w;
  if (w < s->size && s->ranks[w] == w) return w;
  if (!s->inv) {
    int top = 0;
    for (int i = 0; i < s->size; i++)
      if (s->ranks[i] >= top) top = s->ranks[i] + 1;
    int *inv = malloc(sizeof(int) * (size_t)(top ? top : 1));
    if (!inv) { /* no memory: search */
      for (int i = 0; i < s->size; i++)
        if (s->ranks[i] == w) return i;
      return op_undefined;
    }
    for (int i = 0; i < top; i++) inv[i] = -1;
    for (int i = 0; i < s->size; i++)
      if (s->ranks[i] >= 0) inv[s->ranks[i]] = i;
    s->inv = inv;
    s->ninv = top;
  }
  return w < s->ninv && s->inv[w] >= 0 ? s->inv[w] : op_undefined;
}

static void status_fill(Py_buffer *v, long source, long tag, uint64_t nbytes) {
  int *f = v->buf;
  f[0] = (int)(uint32_t)(nbytes & 0xFFFFFFFFu);
  f[1] = (int)(((nbytes >> 32) & 0x3FFFFFFFu) << 1); /* not cancelled */
  f[2] = (int)source;
  f[3] = (int)tag;
}

/* recv_st(state, buf, source, tag, status): the method Recv.  With status
 * None, recv; else a completed receive without error fills status and
 * answers 0, any other answer is recv_status's (1 miss, (error, world
 * source, tag, nbytes), (rc, left)) for Python to finish. */
static PyObject *pf_recv_st(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  Py_buffer v, *sv;
  if (n != 5 || !status_arg(args[4], &v, &sv)) return PyLong_FromLong(1);
  PyObject *r = do_recv(args, 4, sv != NULL, sv);
  if (sv) PyBuffer_Release(sv);
  return r;
}

static void op_release(pf_op *o) {
  if (o->req && o->fields && !o->waiters) {
    erdma_req_free(o->req);
    o->req = NULL;
    Py_CLEAR(o->keep);
  }
}

/* The fields of a send's status without an error (one tuple shared by all):
 * a new reference, or NULL */
static PyObject *op_send_fields(void) {
  if (!op_done_fields && !(op_done_fields = Py_BuildValue("(llliO)", op_any_source,
                                                          op_any_tag, 0L, 0, Py_False)))
    return NULL;
  Py_INCREF(op_done_fields);
  return op_done_fields;
}

/* The request completed with *st: its fields; -1 with an exception. */
static int op_complete(pf_op *o, const erdma_status *st) {
  if (o->fields) return 0; /* another thread was first */
  if (!o->index && !st->error && !st->cancelled) {
    if (!(o->fields = op_send_fields())) return -1;
    op_release(o);
    return 0;
  }
  long src = op_any_source, tag = op_any_tag, cls = 0;
  unsigned long long nbytes = 0;
  if (o->index) {
    src = st->source;
    if (src >= 0) {
      PyObject *k = PyLong_FromLong(src);
      if (!k) return -1;
      PyObject *v = PyDict_GetItemWithError(o->index, k); /* borrowed */
      Py_DECREF(k);
      if (!v && PyErr_Occurred()) return -1;
      src = v ? PyLong_AsLong(v) : op_undefined;
    }
    tag = st->tag;
    nbytes = st->nbytes;
  }
  if (st->error) {
    cls = op_err_other;
    PyObject *k = PyLong_FromLong(st->error);
    if (!k) return -1;
    PyObject *v = op_errclass ? PyDict_GetItemWithError(op_errclass, k) : NULL;
    Py_DECREF(k);
    if (!v && PyErr_Occurred()) return -1;
    if (v) cls = PyLong_AsLong(v);
  }
  o->fields = Py_BuildValue("(lllKO)", src, tag, cls, nbytes, st->cancelled ? Py_True : Py_False);
  if (!o->fields) return -1;
  op_release(o);
  return 0;
}

static PyObject *op_fail(int rc, const char *what) {
  if (!op_raise) {
    PyErr_Format(PyExc_RuntimeError, "erdma error %d (%s)", rc, what);
    return NULL;
  }
  PyObject *r = PyObject_CallFunction(op_raise, "is", rc, what);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "erdma error %d (%s)", rc, what);
  return NULL;
}

static PyObject *op_test(PyObject *self, PyObject *unused) {
  pf_op *o = (pf_op *)self;
  if (o->fields) Py_RETURN_TRUE;
  if (!o->req) Py_RETURN_FALSE; /* parked: the engine finishes it */
  int done = 0;
  erdma_status st;
  int rc = erdma_req_test(o->req, &done, &st);
  if (!done) {
    if (rc) return op_fail(rc, "test");
    Py_RETURN_FALSE;
  }
  if (op_complete(o, &st)) return NULL;
  Py_RETURN_TRUE;
}

static PyObject *op_wait(PyObject *self, PyObject *unused) {
  pf_op *o = (pf_op *)self;
  erdma_status st;
  int rc = 0;
  if (o->fields) Py_RETURN_NONE;
  if (!o->req) return op_fail(ERDMA_ERR_INVAL, "wait");
  erdma_req *r = o->req;
  if (erdma_req_peek(r, &st)) { /* done already: no lock, the GIL kept */
    if (op_complete(o, &st)) return NULL;
    Py_RETURN_NONE;
  }
  for (;;) {
    o->waiters++;
    PyThreadState *ts = PyEval_SaveThread();
    rc = erdma_req_wait(r, o->slice, &st);
    PyEval_RestoreThread(ts);
    o->waiters--;
    if (o->fields) { /* another thread completed it */
      op_release(o);
      Py_RETURN_NONE;
    }
    if (rc != ERDMA_ERR_TIMEOUT) break;
    if (PyErr_CheckSignals()) return NULL;
  }
  if (rc) return op_fail(rc, "wait");
  if (op_complete(o, &st)) return NULL;
  Py_RETURN_NONE;
}

/* Request's slots `_op`, `_predef` and `_start`, read and written through
 * their member descriptors, found once (setup): a generic getattr/setattr
 * first looks the name up along the type's MRO, which cost more than the
 * rest of making an Isend's request.  Another type (a subclass), or a
 * descriptor without both functions: the generic way. */
typedef struct {
  PyObject *d;
  descrgetfunc get;
  descrsetfunc set;
} pf_slot;
static pf_slot slot_op, slot_predef, slot_start;
static PyTypeObject *request_type;

static int slot_find(pf_slot *sl, PyObject *name) {
  PyObject *d = PyObject_GetAttr((PyObject *)request_type, name);
  if (!d) return -1;
  sl->get = (descrgetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_get);
  sl->set = (descrsetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_set);
  if (sl->get && sl->set) {
    sl->d = d;
  } else {
    sl->d = NULL;
    Py_DECREF(d);
  }
  return 0;
}

static PyObject *req_get(const pf_slot *sl, PyObject *req, PyObject *name) {
  if (sl->d && Py_TYPE(req) == request_type)
    return sl->get(sl->d, req, (PyObject *)request_type);
  return PyObject_GetAttr(req, name);
}

static int req_set(const pf_slot *sl, PyObject *req, PyObject *name, PyObject *v) {
  if (sl->d && Py_TYPE(req) == request_type) return sl->set(sl->d, req, v);
  return PyObject_SetAttr(req, name, v);
}

/* end_inline(requests, names, exc, done_type): request._end_inline in C:
 * from the first request of the list `requests` on, end those whose Op (a
 * C Op waited here, or a done_type complete from the start with no object)
 * completes without an error: `_op` None, and `_h` 0 when names["_named"]
 * (erdmampi.request's globals) is true.  Answers
 * how many; the first other one is left to Python (an exception of class
 * exc from the wait stops there, cleared: Python's loop reports it). */
static PyObject *str_group, *str_index, *str_op, *str_predef, *str_start, *no_args;
static PyObject *str_h, *str_obj, *str_named;
static Py_ssize_t end_inline_run(PyObject *const *args);
static PyObject *pf_end_inline(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyType_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "end_inline(list, names, exc, done_type)");
    return NULL;
  }
  Py_ssize_t start = end_inline_run(args);
  return start < 0 ? NULL : PyLong_FromSsize_t(start);
}

/* Request.Waitall as a classmethod (args[0] the class): the common call,
 * a list and no statuses, ends what end_inline can and leaves the rest to
 * cls._waitall_rest; any other call goes to cls._waitall_py, the Python
 * method, as it is.  waitall_setup(names, exc, done_type) gives it
 * end_inline's other arguments. */
static PyObject *wa_args[4];
static PyObject *pf_waitall_setup(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 3 || !PyDict_Check(args[0]) || !PyType_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "waitall_setup(names, exc, done_type)");
    return NULL;
  }
  for (int i = 0; i < 3; i++) {
    PyObject *old = wa_args[i + 1];
    Py_INCREF(args[i]);
    wa_args[i + 1] = args[i];
    Py_XDECREF(old);
  }
  Py_RETURN_NONE;
}

static PyObject *pf_waitall(PyObject *self, PyObject *const *args, Py_ssize_t n,
                            PyObject *kwnames) {
  static PyObject *str_rest, *str_py;
  if ((!str_rest && !(str_rest = PyUnicode_InternFromString("_waitall_rest"))) ||
      (!str_py && !(str_py = PyUnicode_InternFromString("_waitall_py"))))
    return NULL;
  if (n < 1) {
    PyErr_SetString(PyExc_TypeError, "Waitall() needs its class");
    return NULL;
  }
  if (n != 2 || kwnames || !PyList_CheckExact(args[1]) || !wa_args[1]) {
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    PyObject *py = PyObject_GetAttr(args[0], str_py), *pos = NULL, *kw = NULL, *r = NULL;
    if (py && (pos = PyTuple_New(n - 1)) && (!nkw || (kw = PyDict_New()))) {
      int ok = 1;
      for (Py_ssize_t i = 1; i < n; i++) {
        Py_INCREF(args[i]);
        PyTuple_SetItem(pos, i - 1, args[i]);
      }
      for (Py_ssize_t i = 0; i < nkw && ok; i++)
        ok = PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[n + i]) == 0;
      if (ok) r = PyObject_Call(py, pos, kw);
    }
    Py_XDECREF(py);
    Py_XDECREF(pos);
    Py_XDECREF(kw);
    return r;
  }
  PyObject *call[4] = {args[1], wa_args[1], wa_args[2], wa_args[3]};
  Py_ssize_t start = end_inline_run(call);
  if (start < 0) return NULL;
  if (start < PyList_Size(args[1])) {
    PyObject *at = PyLong_FromSsize_t(start);
    PyObject *r = at ? PyObject_CallMethodObjArgs(args[0], str_rest, args[1], Py_None, at, NULL)
                     : NULL;
    Py_XDECREF(at);
    if (!r) return NULL;
    Py_DECREF(r);
  }
  Py_RETURN_TRUE;
}

/* end_inline's loop: args as end_inline's; the count, or -1 (raised) */
static Py_ssize_t end_inline_run(PyObject *const *args) {
  if ((!str_op && !(str_op = PyUnicode_InternFromString("_op"))) ||
      (!str_h && !(str_h = PyUnicode_InternFromString("_h"))) ||
      (!str_obj && !(str_obj = PyUnicode_InternFromString("obj"))) ||
      (!str_named && !(str_named = PyUnicode_InternFromString("_named"))))
    return -1;
  PyObject *list = args[0], *zero = NULL;
  Py_ssize_t start = 0;
  for (;; start++) {
    if (start >= PyList_Size(list)) break; /* the list may change while the GIL is released */
    PyObject *req = PyList_GetItem(list, start);
    if (!req) return -1;
    Py_INCREF(req);
    PyObject *op = req_get(&slot_op, req, str_op);
    int end = 0;
    if (!op) {
      PyErr_Clear();
    } else if (Py_TYPE(op) == (PyTypeObject *)op_type) {
      PyObject *r = op_wait(op, NULL);
      if (r) {
        Py_DECREF(r);
        PyObject *f = ((pf_op *)op)->fields, *cls = f ? PyTuple_GetItem(f, 2) : NULL;
        end = cls && PyObject_IsTrue(cls) == 0;
        PyErr_Clear();
      } else if (PyErr_ExceptionMatches(args[2])) {
        PyErr_Clear();
      } else { /* an interrupt: raised */
        Py_DECREF(op);
        Py_DECREF(req);
        Py_XDECREF(zero);
        return -1;
      }
    } else if (Py_TYPE(op) == (PyTypeObject *)args[3]) {
      PyObject *obj = PyObject_GetAttr(op, str_obj);
      end = obj == Py_None;
      Py_XDECREF(obj);
      PyErr_Clear();
    }
    Py_XDECREF(op);
    if (end && req_set(&slot_op, req, str_op, Py_None)) end = 0;
    if (end) { /* _named read now: another thread may have named a handle meanwhile */
      PyObject *nm = PyDict_GetItemWithError(args[1], str_named);
      int named = nm ? PyObject_IsTrue(nm) : PyErr_Occurred() ? -1 : 0;
      if (named < 0 ||
          (named && (!(zero = zero ? zero : PyLong_FromLong(0)) ||
                     PyObject_SetAttr(req, str_h, zero))))
        end = 0;
    }
    Py_DECREF(req);
    if (!end) {
      if (PyErr_Occurred()) {
        Py_XDECREF(zero);
        return -1;
      }
      break;
    }
  }
  Py_XDECREF(zero);
  return start;
}

static PyObject *op_cancel(PyObject *self, PyObject *unused) {
  pf_op *o = (pf_op *)self;
  if (o->req && !o->fields) erdma_req_cancel(o->req);
  Py_RETURN_NONE;
}

/* Hand a pending request to `park` (it owns it from now on). */
static void op_park_req(pf_op *o) {
  if (!o->req || o->fields || o->waiters) return;
  erdma_req *r = o->req;
  PyObject *keep = o->keep;
  o->req = NULL;
  o->keep = NULL;
  PyObject *res = op_park ? PyObject_CallFunction(op_park, "KO",
                                                  (unsigned long long)(uintptr_t)r,
                                                  keep ? keep : Py_None)
                          : NULL;
  if (!res) { /* nowhere to park it (interpreter shutdown): withdraw it, so
               * that the engine never touches the buffer released below */
    PyErr_Clear();
    erdma_req_abort(r);
    erdma_req_free(r);
  }
  Py_XDECREF(res);
  Py_XDECREF(keep);
}

static PyObject *op_free(PyObject *self, PyObject *unused) {
  op_park_req((pf_op *)self);
  Py_RETURN_NONE;
}

static void op_dealloc(PyObject *self) {
  pf_op *o = (pf_op *)self;
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  if (o->req && !o->fields) op_park_req(o);
  if (o->req) erdma_req_free(o->req);
  PyErr_Restore(et, ev, tb);
  Py_XDECREF(o->keep);
  Py_XDECREF(o->index);
  Py_XDECREF(o->fields);
  PyTypeObject *tp = Py_TYPE(self);
  freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  f(self);
  Py_DECREF(tp);
}

static PyObject *op_get_fields(PyObject *self, void *c) {
  pf_op *o = (pf_op *)self;
  return Py_NewRef(o->fields ? o->fields : Py_None);
}
static PyObject *op_get_none(PyObject *self, void *c) { Py_RETURN_NONE; }
static PyObject *op_get_false(PyObject *self, void *c) { Py_RETURN_FALSE; }
/* the engine request's address while it is the op's (0: none), for waitany */
static PyObject *op_get_handle(PyObject *self, void *c) {
  pf_op *o = (pf_op *)self;
  return PyLong_FromVoidPtr(o->fields ? NULL : o->req);
}

static PyMethodDef op_methods[] = {
    {"test", op_test, METH_NOARGS, NULL},     {"wait", op_wait, METH_NOARGS, NULL},
    {"cancel", op_cancel, METH_NOARGS, NULL}, {"free", op_free, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};
static PyGetSetDef op_getset[] = {{"fields", op_get_fields, NULL, NULL, NULL},
                                  {"obj", op_get_none, NULL, NULL, NULL},
                                  {"persistent", op_get_false, NULL, NULL, NULL},
                                  {"handle", op_get_handle, NULL, NULL, NULL},
                                  {NULL, NULL, NULL, NULL, NULL}};
static PyType_Slot op_slots[] = {{Py_tp_dealloc, op_dealloc},
                                 {Py_tp_methods, op_methods},
                                 {Py_tp_getset, op_getset},
                                 {0, NULL}};
static PyType_Spec op_spec = {"erdmampi._erdma_fast.Op", sizeof(pf_op), 0, Py_TPFLAGS_DEFAULT,
                              op_slots};

/* A new Op for posted request r (index: NULL for a send). */
static PyObject *op_new(erdma_req *r, PyObject *keep, PyObject *index, double slice) {
  PyTypeObject *tp = (PyTypeObject *)op_type;
  allocfunc a = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
  pf_op *o = (pf_op *)a(tp, 0);
  if (!o) {
    erdma_req_abort(r);
    erdma_req_free(r);
    return NULL;
  }
  o->req = r;
  o->keep = Py_NewRef(keep);
  o->index = index ? Py_NewRef(index) : NULL;
  o->fields = NULL;
  o->slice = slice;
  o->waiters = 0;
  return (PyObject *)o;
}

/* An Op complete from the start: a send that went into a local peer's
 * ring (the fields of a send's status; one tuple shared by all). */
static PyObject *op_done_send(void) {
  PyObject *fields = op_send_fields();
  if (!fields) return NULL;
  PyTypeObject *tp = (PyTypeObject *)op_type;
  allocfunc a = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
  pf_op *o = (pf_op *)a(tp, 0);
  if (!o) {
    Py_DECREF(fields);
    return NULL;
  }
  o->req = NULL;
  o->keep = NULL;
  o->index = NULL;
  o->fields = fields;
  o->slice = 0;
  o->waiters = 0;
  return (PyObject *)o;
}

/* isend(state, buf, dest, tag) / irecv(state, buf, source, tag, index): a
 * nonblocking operation on a remembered spec, for Comm.Isend / Comm.Irecv
 * (index: the communicator's world rank -> rank dict): 1 (miss: nothing
 * done); a negative ERDMA error; else an Op: of the posted request, or
 * (isend only) complete, the message in the local peer's ring. */
static PyObject *pf_isend(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long tag;
  int dest;
  pf_state *s;
  pf_entry *x;
  /* no weak entries: the request outlives this call, an export for it would not */
  if (n != 4 || !p2p_args(args, 0, &s, &x, &dest, &tag, NULL)) return PyLong_FromLong(1);
  s->hits++;
  if (erdma_shm_try_send(s->e, x->view.buf, (uint64_t)x->view.len, dest, (int)tag, s->ctx, 0))
    return op_done_send();
  erdma_req *r = NULL;
  int rc = erdma_isend(s->e, x->view.buf, (uint64_t)x->view.len, dest, (int)tag, s->ctx, 0,
                       &r);
  return rc ? PyLong_FromLong(rc < 0 ? rc : -rc) : op_new(r, args[1], NULL, s->slice);
}

static PyObject *pf_irecv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long tag;
  int src;
  pf_state *s;
  pf_entry *x;
  if (n != 5 || !PyDict_CheckExact(args[4]) || !p2p_args(args, 1, &s, &x, &src, &tag, NULL))
    return PyLong_FromLong(1);
  erdma_req *r = NULL;
  s->hits++;
  int rc = erdma_irecv(s->e, x->view.buf, (uint64_t)x->view.len, src, (int)tag, s->ctx, 0, &r);
  return rc ? PyLong_FromLong(rc < 0 ? rc : -rc) : op_new(r, args[1], args[4], s->slice);
}

/* sendrecv(state, sendbuf, dest, sendtag, recvbuf, source, recvtag): the
 * remembered send and receive specs, a rank (not ANY_SOURCE) on each side.
 * The send is posted first: a receive matched meanwhile then sees it and
 * reads the peer's message whole rather than splitting the copy with a peer
 * busy reading ours (erdma_match.c take_offered).  Answers 1 (miss:
 * nothing done); (rerr, world source, tag, nbytes, serr) when both
 * completed; or (rc, rleft, sleft): rc ERDMA_ERR_TIMEOUT with the requests
 * still to wait for after `slice` seconds (0: none), any other rc an error
 * that withdrew both. */
/* remember_packed(state, recv, arr, count, dt, rec, flags, ent, n, step,
 * off_addr, ln_addr, nruns, total): a packed Sendrecv side (see pf_packed)
 * that Python checked: arr a C-contiguous numpy.ndarray (writeable for a
 * receive; flags is arr.flags.num as Python saw it), count items of dt
 * (record rec) inside it, moved by the plan (n items of nruns runs at
 * off/ln, step bytes apart; total packed bytes) into ent[5]. */
static PyObject *pf_remember_packed(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 14) {
    PyErr_SetString(PyExc_TypeError, "remember_packed() takes 14 arguments");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  int recv = PyObject_IsTrue(args[1]);
  PyObject *arr = args[2], *dt = args[4], *rec = args[5], *ent = args[7];
  long count = PyLong_AsLong(args[3]);
  long flags = PyLong_AsLong(args[6]);
  unsigned long long pn = PyLong_AsUnsignedLongLong(args[8]);
  long long step = PyLong_AsLongLong(args[9]);
  void *off = PyLong_AsVoidPtr(args[10]), *ln = PyLong_AsVoidPtr(args[11]);
  unsigned long long nruns = PyLong_AsUnsignedLongLong(args[12]);
  unsigned long long total = PyLong_AsUnsignedLongLong(args[13]);
  if (PyErr_Occurred()) return NULL;
  if (!s || recv < 0 || count <= 0 || !PyTuple_CheckExact(ent) || PyTuple_Size(ent) < 6 ||
      (total && (!off || !ln)))
    Py_RETURN_FALSE;
  int need = NP_C_CONTIGUOUS | (recv ? NP_WRITEABLE : 0);
  if (((np_head *)arr)->flags != (int)flags || (flags & need) != need) Py_RETURN_FALSE;
  pf_packed *x = NULL;
  for (int i = 0; i < PF_SLOTS && !x; i++) {
    pf_packed *y = &s->pk[recv][i];
    if (y->have && y->arr == arr && y->dt == dt && y->count == count) x = y;
  }
  if (!x) /* a new one: the slot to replace */
    for (int i = 0; i < PF_SLOTS; i++) {
      pf_packed *y = &s->pk[recv][i];
      if (!y->busy && (!x || evicts_before(y->have, y->used, x->have, x->used))) x = y;
    }
  if (!x || x->busy) Py_RETURN_FALSE;
  x->used = ++s->tick;
  Py_buffer tmp;
  if (PyObject_GetBuffer(PyTuple_GetItem(ent, 5), &tmp, PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if ((unsigned long long)tmp.len < total) {
    PyBuffer_Release(&tmp);
    Py_RETURN_FALSE;
  }
  packed_clear(x);
  if (!layout_keep(&x->l, arr)) {
    PyBuffer_Release(&tmp);
    Py_RETURN_FALSE;
  }
  x->tmp = tmp;
  x->arr = Py_NewRef(arr);
  x->dt = Py_NewRef(dt);
  x->rec = Py_NewRef(rec);
  x->ent = Py_NewRef(ent);
  x->count = count;
  x->need = need;
  x->n = pn;
  x->step = step;
  x->off = off;
  x->ln = ln;
  x->nruns = nruns;
  x->total = total;
  x->have = 1;
  Py_RETURN_TRUE;
}

static PyObject *str_r; /* "_r": a Datatype's record */

/* A side whose bytes are one run of the array (a row of a halo): it moves
 * from and into the array itself, without the temporary. */
static int packed_direct(const pf_packed *x) { return x->n == 1 && x->nruns == 1; }

/* The remembered packed side that `buf` ([arr, count, dt]) still is, else
 * NULL. */
static pf_packed *packed_for(pf_state *s, int recv, PyObject *buf) {
  PyObject *a, *c, *d;
  if (PyList_CheckExact(buf)) {
    if (PyList_Size(buf) != 3) return NULL;
    a = PyList_GetItem(buf, 0);
    c = PyList_GetItem(buf, 1);
    d = PyList_GetItem(buf, 2);
  } else if (PyTuple_CheckExact(buf)) {
    if (PyTuple_Size(buf) != 3) return NULL;
    a = PyTuple_GetItem(buf, 0);
    c = PyTuple_GetItem(buf, 1);
    d = PyTuple_GetItem(buf, 2);
  } else {
    return NULL;
  }
  long count;
  if (!small_int(c, 1, LONG_MAX, &count)) return NULL;
  pf_packed *x = NULL;
  for (int i = 0; i < PF_SLOTS && !x; i++) {
    pf_packed *y = &s->pk[recv][i];
    if (y->have && y->arr == a && y->dt == d && y->count == count) x = y;
  }
  if (!x || x->busy || !layout_is(&x->l, a) ||
      (((np_head *)a)->flags & x->need) != x->need)
    return NULL;
  if (!str_r && !(str_r = PyUnicode_InternFromString("_r"))) {
    PyErr_Clear();
    return NULL;
  }
  PyObject *r = PyObject_GetAttr(d, str_r);
  if (!r) {
    PyErr_Clear();
    return NULL;
  }
  Py_DECREF(r); /* compared by identity only; x->rec holds the one remembered */
  if (r != x->rec) return NULL;
  x->used = ++s->tick;
  return x;
}

/* sendrecv(state, sendbuf, dest, sendtag, recvbuf, source, recvtag): each
 * side a remembered plain spec (pf_entry) or packed side (pf_packed; the
 * send side packed into its temporary, the receive side unpacked from its
 * temporary once the message is in, only as far as the message goes).
 * Answers 1 (miss), (error, world source, tag, nbytes, send error), or
 * (rc, rleft, sleft) as the blocking calls do; with a packed side, a
 * pending answer is (rc, rleft, sleft, (rent, sent)): the sides' Python
 * entries (None for a plain side), which keep the temporaries the requests
 * still use and tell Python what to unpack; rent is the array itself when
 * the receive goes straight into it (packed_direct). */
/* replace: Sendrecv_replace, sendbuf and recvbuf one plain spec: only a send
 * that goes into a local peer's ring now (its bytes copied before the
 * receive can land) runs here.  method: the method Sendrecv, whose clean
 * completion answers 0 and fills the status view sv (unless NULL). */
static PyObject *sendrecv_impl(PyObject *const *args, int replace, int method, Py_buffer *sv) {
  long dest, stag, src, rtag;
  pf_state *s;
  pf_entry *sx = NULL, *rx = NULL;
  pf_packed *sp = NULL, *rp = NULL;
  pf_mem sm, rm;
  if (!(s = state_of(args[0])) || !small_int(args[2], 0, s->size - 1, &dest) ||
      !small_int(args[3], 0, s->tag_ub, &stag) ||
      !small_int(args[5], ERDMA_ANY_SOURCE, s->size - 1, &src) || src == -1 ||
      !small_int(args[6], ERDMA_ANY_TAG, s->tag_ub, &rtag) ||
      (!(sx = entry_for(s, 0, args[1], &sm)) && (replace || !(sp = packed_for(s, 0, args[1])))))
    return PyLong_FromLong(1);
  if (!(rx = entry_for(s, 1, args[4], &rm)) &&
      (replace || !(rp = packed_for(s, 1, args[4])))) {
    if (sx) mem_done(&sm);
    return PyLong_FromLong(1);
  }
  /* bytes, a bytearray: exported for the whole call, so waited on here to
   * the end (as raw_wait); with a packed other side, or in place: Python */
  int raw = sx == &s->raw || rx == &s->raw;
  if (raw && (!sx || !rx || replace)) {
    if (sx) mem_done(&sm);
    if (rx) mem_done(&rm);
    return PyLong_FromLong(1);
  }
  if (replace && (sm.buf != rm.buf || sm.len != rm.len)) {
    mem_done(&sm);
    mem_done(&rm);
    return PyLong_FromLong(1);
  }
  /* the packed sides' arrays stay exported while they are read or written */
  Py_buffer sav, rav;
  const void *sbuf;
  void *rbuf;
  uint64_t slen, rlen;
  if (sx) {
    sbuf = sm.buf;
    slen = sm.len;
  } else {
    if (PyObject_GetBuffer(sp->arr, &sav, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      if (rx) mem_done(&rm);
      return PyLong_FromLong(1);
    }
    sbuf = packed_direct(sp) ? (const char *)sav.buf + sp->off[0] : sp->tmp.buf;
    slen = sp->total;
  }
  if (rx) {
    rbuf = rm.buf;
    rlen = rm.len;
  } else {
    if (PyObject_GetBuffer(rp->arr, &rav, PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      if (sp) PyBuffer_Release(&sav);
      else mem_done(&sm);
      return PyLong_FromLong(1);
    }
    rbuf = packed_direct(rp) ? (char *)rav.buf + rp->off[0] : rp->tmp.buf;
    rlen = rp->total;
  }
  erdma_req *rr = NULL, *sr = NULL;
  erdma_status rst, sst;
  memset(&sst, 0, sizeof sst);
  if (sx) sx->busy++; else sp->busy++;
  if (rx) rx->busy++; else rp->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = 0;
  if (sp && sp->total && !packed_direct(sp))
    rc = erdma_pack_runs(sp->tmp.buf, sav.buf, sp->n, sp->step, sp->off, sp->ln, sp->nruns);
  int sent = !rc && erdma_shm_try_send(s->e, sbuf, slen, s->ranks[dest], (int)stag, s->ctx,
                                       ERDMA_SEND_EXCHANGE);
  if (!sent && replace) { /* nothing done: Python sends from a copy */
    PyEval_RestoreThread(ts);
    sx->busy--;
    rx->busy--;
    mem_done(&sm);
    mem_done(&rm);
    return PyLong_FromLong(1);
  }
  if (!rc && !sent)
    rc = erdma_isend(s->e, sbuf, slen, s->ranks[dest], (int)stag, s->ctx, 0, &sr);
  if (!rc)
    rc = erdma_irecv(s->e, rbuf, rlen, src == ERDMA_ANY_SOURCE ? ERDMA_ANY_SOURCE : s->ranks[src],
                     (int)rtag, s->ctx, 0, &rr);
  if (!rc) rc = erdma_req_wait(rr, s->slice, &rst);
  if (!rc && sr) rc = erdma_req_wait(sr, s->slice, &sst);
  while (raw && rc == ERDMA_ERR_TIMEOUT) { /* signal checks between slices */
    PyEval_RestoreThread(ts);
    int sig = PyErr_CheckSignals();
    ts = PyEval_SaveThread();
    if (sig) {
      rc = PF_SIGNALLED; /* both withdrawn below, the exception raised */
      break;
    }
    rc = erdma_req_wait(rr, s->slice, &rst);
    if (!rc && sr) rc = erdma_req_wait(sr, s->slice, &sst);
  }
  if (rc && rc != ERDMA_ERR_TIMEOUT) {
    erdma_req *both[2] = {rr, sr};
    for (int i = 0; i < 2; i++)
      if (both[i]) {
        erdma_req_abort(both[i]);
        erdma_req_free(both[i]);
      }
    rr = sr = NULL;
  }
  if (!rc && rp && !rst.error && rst.nbytes && !packed_direct(rp)) {
    if (rst.nbytes >= rp->total)
      erdma_unpack_runs(rav.buf, rp->tmp.buf, rp->n, rp->step, rp->off, rp->ln, rp->nruns);
    else
      erdma_unpack_runs_head(rav.buf, rp->tmp.buf, rst.nbytes, rp->n, rp->step, rp->off,
                             rp->ln, rp->nruns);
  }
  PyEval_RestoreThread(ts);
  s->hits++;
  if (sx) sx->busy--; else sp->busy--;
  if (rx) rx->busy--; else rp->busy--;
  if (sp) PyBuffer_Release(&sav);
  else mem_done(&sm);
  if (rp) PyBuffer_Release(&rav);
  else mem_done(&rm);
  if (rc == PF_SIGNALLED) return NULL;
  if (rc) {
    if (rc == ERDMA_ERR_TIMEOUT && (sp || rp))
      return Py_BuildValue("(iKK(OO))", rc, (unsigned long long)(uintptr_t)rr,
                           (unsigned long long)(uintptr_t)sr,
                           !rp ? Py_None : packed_direct(rp) ? rp->arr : rp->ent,
                           sp ? sp->ent : Py_None);
    return Py_BuildValue("(iKK)", rc, (unsigned long long)(uintptr_t)rr,
                         (unsigned long long)(uintptr_t)sr);
  }
  erdma_req_free(rr);
  if (sr) erdma_req_free(sr);
  if (method && !rst.error && !sst.error) {
    if (sv) status_fill(sv, comm_rank(s, rst.source), rst.tag, rst.nbytes);
    return PyLong_FromLong(0);
  }
  return Py_BuildValue("(iiiKi)", rst.error, rst.source, rst.tag,
                       (unsigned long long)rst.nbytes, sst.error);
}

static PyObject *pf_sendrecv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return n == 7 ? sendrecv_impl(args, 0, 0, NULL) : PyLong_FromLong(1);
}

/* hits(state): how many Sendrecv, Isend and Irecv calls ran here (their C
 * methods do not tell Python of them; comm_p2p._p2p_learn reads this). */
static PyObject *pf_hits(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pf_state *s = n == 1 ? state_of(args[0]) : NULL;
  return PyLong_FromUnsignedLong(s ? s->hits : 0);
}

/* sendrecv_st(state, sendbuf, dest, sendtag, recvbuf, source, recvtag,
 * status): the method Sendrecv: as sendrecv, but a clean completion fills
 * status (unless None) and answers 0. */
static PyObject *pf_sendrecv_st(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  Py_buffer v, *sv;
  if (n != 8 || !status_arg(args[7], &v, &sv)) return PyLong_FromLong(1);
  PyObject *r = sendrecv_impl(args, 0, 1, sv);
  if (sv) PyBuffer_Release(sv);
  return r;
}

/* Sendrecv_replace's call of sendrecv_impl: args (state, buf, dest,
 * sendtag, source, recvtag), buf both ways. */
static PyObject *sendrecv_replace_impl(PyObject *const *args, int method, Py_buffer *sv) {
  PyObject *a[7] = {args[0], args[1], args[2], args[3], args[1], args[4], args[5]};
  return sendrecv_impl(a, 1, method, sv);
}

/* sendrecv_replace(state, buf, dest, sendtag, source, recvtag): Sendrecv_replace
 * of a plain spec remembered both ways whose message goes into a local
 * peer's ring now; answers as sendrecv (1: nothing done). */
static PyObject *pf_sendrecv_replace(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return n == 6 ? sendrecv_replace_impl(args, 0, NULL) : PyLong_FromLong(1);
}

/* sendrecv_replace_st(state, buf, dest, sendtag, source, recvtag, status):
 * the method Sendrecv_replace, as sendrecv_st is Sendrecv's. */
static PyObject *pf_sendrecv_replace_st(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  Py_buffer v, *sv;
  if (n != 7 || !status_arg(args[6], &v, &sv)) return PyLong_FromLong(1);
  PyObject *r = sendrecv_replace_impl(args, 1, sv);
  if (sv) PyBuffer_Release(sv);
  return r;
}

/* Buffer export of a remembered array: flags as Python saw them (the layout
 * check), `need` among them. */
static int coll_view(PyObject *arr, long flags, int need, int writable, Py_buffer *view) {
  if (((np_head *)arr)->flags != (int)flags || (flags & need) != need) return 0;
  if (PyObject_GetBuffer(arr, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

/* What decides that a remembered collective runs uncompressed in one
 * engine call, kept in x for coll_still (mode: a new reference). */
static void coll_keep_checks(pf_coll *x, PyObject *env, PyObject *envkey, PyObject *cfg,
                             PyObject *mode, PyObject *hints) {
  x->env = Py_NewRef(env);
  x->envkey = Py_NewRef(envkey);
  x->cfg = Py_NewRef(cfg);
  x->mode = mode;
  x->hints = Py_NewRef(hints);
}

/* A collective's answer: 0 done, else (rc, pending) */
static PyObject *coll_result(int rc, erdma_coll *pending) {
  if (rc == 0) return PyLong_FromLong(0);
  return Py_BuildValue("(iK)", rc, (unsigned long long)(uintptr_t)pending);
}

enum { SR_ALLREDUCE, SR_REDUCE_SCATTER, SR_ALLTOALL, SR_ALLGATHER };

/* The slot of a remembered Allreduce, Reduce_scatter_block, Alltoall or Allgather. */
static pf_coll *sr_slot(pf_state *s, int which) {
  return which == SR_ALLTOALL ? &s->a2a
       : which == SR_ALLGATHER ? &s->ag
       : which == SR_REDUCE_SCATTER ? &s->rs : &s->ar;
}

/* remember_allreduce(state, sspec, sarr, sdt, rspec, rarr, rdt, op, count, opc, dtc,
 *                    sflags, rflags, env, envkey, cfg, hints[, weak, kind, part]):
 * Python found this call one for erdma_coll_allreduce (sarr None: in place,
 * sspec is IN_PLACE; sdt/rdt None: the spec is the array alone);
 * remember_reduce_scatter the same for erdma_coll_reduce_scatter,
 * remember_alltoall / remember_allgather for erdma_coll_alltoall /
 * erdma_coll_allgather of count-byte blocks (op None, opc and dtc 0), or
 * with kind 1 for erdma_coll_alltoall_bulk (pull_part `part`) /
 * erdma_coll_allgather_bulk; kind 1 of the two reducing calls: two ranks,
 * erdma_coll_allreduce_pair / _reduce_scatter_pair.  weak: the arrays are
 * not kept (see pf_coll). */
static PyObject *remember_sr(PyObject *const *args, Py_ssize_t n, int which) {
  if (n != 17 && n != 20) {
    PyErr_SetString(PyExc_TypeError, "remember_*() takes 17 or 20 arguments");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  unsigned long long count = PyLong_AsUnsignedLongLong(args[8]);
  long opc = PyLong_AsLong(args[9]), dtc = PyLong_AsLong(args[10]);
  long sflags = PyLong_AsLong(args[11]), rflags = PyLong_AsLong(args[12]);
  int weak = n == 20 ? PyObject_IsTrue(args[17]) : 0;
  long kind = n == 20 ? PyLong_AsLong(args[18]) : 0;
  double part = n == 20 ? PyFloat_AsDouble(args[19]) : -1.0;
  if (PyErr_Occurred()) return NULL;
  pf_coll *slot = s ? sr_slot(s, which) : NULL;
  if (!s || slot->busy || !PyDict_Check(args[13]) || !PyDict_Check(args[16]) || weak < 0 ||
      kind < 0 || kind > 1 ||
      (kind && (which == SR_ALLREDUCE || which == SR_REDUCE_SCATTER) && s->size != 2))
    Py_RETURN_FALSE;
  PyObject *mode = PyObject_GetAttrString(args[15], "mode");
  if (!mode) return NULL;
  pf_coll x = {0};
  PyObject *sarr = args[2] == Py_None ? NULL : args[2];
  if (weak) {
    /* the flags as Python saw them (the layout check), then the layouts */
    int ok = ((np_head *)args[5])->flags == (int)rflags &&
             (rflags & (NP_C_CONTIGUOUS | NP_WRITEABLE)) == (NP_C_CONTIGUOUS | NP_WRITEABLE) &&
             (!sarr || (((np_head *)sarr)->flags == (int)sflags && (sflags & NP_C_CONTIGUOUS)));
    if (!ok || !layout_keep(&x.rl, args[5]) || (sarr && !layout_keep(&x.sl, sarr))) {
      layout_clear(&x.rl);
      layout_clear(&x.sl);
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
  } else {
    if (sarr && !coll_view(sarr, sflags, NP_C_CONTIGUOUS, 0, &x.sview)) {
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
    if (!coll_view(args[5], rflags, NP_C_CONTIGUOUS | NP_WRITEABLE, 1, &x.rview)) {
      if (sarr) PyBuffer_Release(&x.sview);
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
  }
  coll_clear(slot);
  x.have = 1;
  x.weak = weak;
  x.kind = (int)kind;
  x.part = part;
  if (!weak) {
    x.sspec = Py_NewRef(args[1]);
    x.sarr = sarr ? Py_NewRef(sarr) : NULL;
    x.rspec = Py_NewRef(args[4]);
    x.rarr = Py_NewRef(args[5]);
  } else if (!sarr) {
    x.sspec = Py_NewRef(args[1]); /* MPI.IN_PLACE */
  }
  x.sdt = args[3] == Py_None ? NULL : Py_NewRef(args[3]);
  x.rdt = args[6] == Py_None ? NULL : Py_NewRef(args[6]);
  x.op = Py_NewRef(args[7]);
  x.count = count;
  x.opc = (int)opc;
  x.dtc = (int)dtc;
  coll_keep_checks(&x, args[13], args[14], args[15], mode, args[16]);
  *slot = x;
  Py_RETURN_TRUE;
}

static PyObject *pf_remember_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return remember_sr(args, n, SR_ALLREDUCE);
}

static PyObject *pf_remember_reduce_scatter(PyObject *self, PyObject *const *args,
                                           Py_ssize_t n) {
  return remember_sr(args, n, SR_REDUCE_SCATTER);
}

static PyObject *pf_remember_alltoall(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return remember_sr(args, n, SR_ALLTOALL);
}

static PyObject *pf_remember_allgather(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return remember_sr(args, n, SR_ALLGATHER);
}

/* The tag base of the communicator's next collective call (the counter
 * Python's _coll_base draws from); -1 with an error set, or -2 (a miss). */
static long next_coll_tag(pf_state *s) {
  PyObject *v = PyIter_Next(s->seq);
  if (!v) return PyErr_Occurred() ? -1 : -2;
  long seq = PyLong_AsLong(v);
  Py_DECREF(v);
  if (seq < 0) return PyErr_Occurred() ? -1 : -2;
  return (seq % SEQ_MOD) * COLL_TAGS;
}

/* Whether a remembered collective still takes the one-call way: no
 * ERDMA_COLL_<NAME> override set since, the same compression mode, no hints. */
static int coll_still(pf_coll *x) {
  if (PyDict_Size(x->hints)) return 0;
  static PyObject *mode_name; /* interned once: no string made per call */
  if (!mode_name && !(mode_name = PyUnicode_InternFromString("mode"))) {
    PyErr_Clear();
    return 0;
  }
  int has = PyDict_Contains(x->env, x->envkey);
  PyObject *mode = PyObject_GetAttr(x->cfg, mode_name);
  Py_XDECREF(mode);
  if (has != 0 || mode != x->mode) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

/* Is `spec` (still) the remembered spec of arr (with dt; NULL: arr alone)?
 * With dt, any [arr, dt] list or tuple is: a program that writes the pair
 * in the call makes a new one every time. */
static int spec_is(PyObject *spec, PyObject *want, PyObject *arr, PyObject *dt) {
  PyObject *a, *d;
  if (!dt) return spec == want || (arr && want == arr && same_array(spec, arr));
  return spec_pair(spec, &a, &d) && a == arr && d == dt;
}

/* Do two exports share memory? */
static int views_overlap(const Py_buffer *a, const Py_buffer *b) {
  return (const char *)a->buf < (const char *)b->buf + b->len &&
         (const char *)b->buf < (const char *)a->buf + a->len;
}

/* The array a weakly remembered spec passes (the spec itself, or the first
 * of an [array, dt] pair with the remembered dt) if it has the remembered
 * layout and the flags `need`; else NULL. */
static PyObject *weak_array(PyObject *spec, const pf_layout *l, PyObject *dt, int need) {
  PyObject *a = spec, *d;
  if (dt && !(spec_pair(spec, &a, &d) && d == dt)) return NULL;
  if (!layout_is(l, a) || (((np_head *)a)->flags & need) != need) return NULL;
  return a;
}

/* A new receive array of a weakly remembered call: its pages mapped in one
 * system call if it was never written (erdma_prefault), the GIL released
 * meanwhile.  Arrays a call keeps are not checked: they have been written. */
static void fresh_pages(void *buf, Py_ssize_t len) {
  if (len < ERDMA_PREFAULT_MIN) return;
  PyThreadState *ts = PyEval_SaveThread();
  erdma_prefault(buf, (uint64_t)len);
  PyEval_RestoreThread(ts);
}

static int pair_of(pf_state *s);
static PyObject *pair_allgather(pf_state *s, const void *sb, void *rb, uint64_t blk);
static PyObject *pair_alltoall(pf_state *s, const void *sb, void *rb, uint64_t blk);

/* The engine call of a remembered Allreduce, Reduce_scatter_block, Alltoall
 * or Allgather (GIL released). */
static int sr_run(pf_state *s, pf_coll *x, int which, const void *sb, void *rb, int tag,
                  erdma_coll **pending) {
  if ((which == SR_ALLREDUCE || which == SR_REDUCE_SCATTER) && x->kind)
    return (which == SR_ALLREDUCE ? erdma_coll_allreduce_pair : erdma_coll_reduce_scatter_pair)(
        s->e, sb, rb, x->count, x->opc, x->dtc, s->ranks, s->size, s->me, tag, s->ctx + 1,
        -1.0);
  if (which == SR_ALLREDUCE || which == SR_REDUCE_SCATTER)
    return (which == SR_ALLREDUCE ? erdma_coll_allreduce : erdma_coll_reduce_scatter)(
        s->e, sb, rb, x->count, x->opc, x->dtc, s->ranks, s->size, s->me, tag, s->ctx + 1,
        s->slice, pending);
  if (!x->kind)
    return (which == SR_ALLTOALL ? erdma_coll_alltoall : erdma_coll_allgather)(
        s->e, sb, rb, x->count, s->ranks, s->size, s->me, tag, s->ctx + 1, s->slice, pending);
  if (which == SR_ALLTOALL)
    return erdma_coll_alltoall_bulk(s->e, sb, rb, x->count, s->ranks, s->size, s->me, x->part,
                                    tag, s->ctx + 1, -1.0);
  uint64_t *ol = malloc(sizeof(uint64_t) * 2 * (size_t)s->size);
  if (!ol) return ERDMA_ERR_NOMEM;
  for (int i = 0; i < s->size; i++) {
    ol[i] = x->count * (uint64_t)i;
    ol[s->size + i] = x->count;
  }
  int rc = erdma_coll_allgather_bulk(s->e, sb, rb, ol, ol + s->size, s->ranks, s->size, s->me,
                                     tag, s->ctx + 1, -1.0);
  free(ol);
  return rc;
}

/* allreduce(state, sendbuf, recvbuf, op) / reduce_scatter(... op) /
 * alltoall(state, sendbuf, recvbuf) / allgather(...) -> 0 | 1 (miss) |
 * (rc, pending): the collective still pending after `slice` seconds */
static PyObject *sr_call(PyObject *const *args, Py_ssize_t n, int which) {
  pf_state *s;
  int reduces = which == SR_ALLREDUCE || which == SR_REDUCE_SCATTER;
  if (n != (reduces ? 4 : 3) || !(s = state_of(args[0]))) return PyLong_FromLong(1);
  pf_coll *x = sr_slot(s, which);
  PyObject *sa = NULL, *ra = NULL;
  if (!x->have || x->busy || (reduces && args[3] != x->op) || !coll_still(x))
    return PyLong_FromLong(1);
  if (x->weak) {
    if (!(ra = weak_array(args[2], &x->rl, x->rdt, NP_C_CONTIGUOUS | NP_WRITEABLE)) ||
        (x->sl.type ? !(sa = weak_array(args[1], &x->sl, x->sdt, NP_C_CONTIGUOUS))
                    : args[1] != x->sspec))
      return PyLong_FromLong(1);
  } else if (!spec_is(args[2], x->rspec, x->rarr, x->rdt) ||
             !spec_is(args[1], x->sspec, x->sarr, x->sdt) ||
             /* the flags of the objects passed (a view over the remembered
              * memory may be read-only) */
             (((np_head *)(x->rdt ? x->rarr : args[2]))->flags &
              (NP_C_CONTIGUOUS | NP_WRITEABLE)) != (NP_C_CONTIGUOUS | NP_WRITEABLE) ||
             (x->sarr && !(((np_head *)(x->sdt ? x->sarr : args[1]))->flags & NP_C_CONTIGUOUS))) {
    return PyLong_FromLong(1);
  }
  /* a weak entry's arrays are exported for the call: their memory stays put */
  Py_buffer sv, rv;
  if (ra && PyObject_GetBuffer(ra, &rv, PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    return PyLong_FromLong(1);
  }
  if (sa && PyObject_GetBuffer(sa, &sv, PyBUF_SIMPLE) != 0) {
    PyErr_Clear();
    PyBuffer_Release(&rv);
    return PyLong_FromLong(1);
  }
  /* a weak entry's arrays may be any two of its layouts: two that share
   * memory go to Python, which checks them as the first call was */
  if (sa && ra && views_overlap(&sv, &rv)) {
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    return PyLong_FromLong(1);
  }
  long tag = next_coll_tag(s);
  if (tag < 0) {
    if (sa) PyBuffer_Release(&sv);
    if (ra) PyBuffer_Release(&rv);
    return tag == -1 ? NULL : PyLong_FromLong(1);
  }
  if (ra) fresh_pages(rv.buf, rv.len);
  erdma_coll *pending = NULL;
  const void *sb = x->weak ? (sa ? sv.buf : NULL) : x->sarr ? x->sview.buf : NULL;
  void *rb = x->weak ? rv.buf : x->rview.buf;
  x->busy++;
  if ((which == SR_ALLGATHER || which == SR_ALLTOALL) && s->size == 2 && x->count &&
      (x->count <= ERDMA_PAIR_DATA_MAX ||
       (which == SR_ALLTOALL && x->count < ERDMA_PAIR_CMA_MAX)) && pair_of(s)) {
    /* by flags (every path of a blocking Allgather or Alltoall, as Bcast's) */
    PyObject *res = (which == SR_ALLGATHER ? pair_allgather : pair_alltoall)(s, sb, rb, x->count);
    x->busy--;
    if (sa) PyBuffer_Release(&sv);
    if (ra) PyBuffer_Release(&rv);
    return res;
  }
  PyThreadState *ts = PyEval_SaveThread();
  int rc = sr_run(s, x, which, sb, rb, (int)tag, &pending);
  PyEval_RestoreThread(ts);
  x->busy--;
  if (sa) PyBuffer_Release(&sv);
  if (ra) PyBuffer_Release(&rv);
  return coll_result(rc, pending);
}

static PyObject *pf_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return sr_call(args, n, SR_ALLREDUCE);
}

static PyObject *pf_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return sr_call(args, n, SR_REDUCE_SCATTER);
}

static PyObject *pf_alltoall(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return sr_call(args, n, SR_ALLTOALL);
}

static PyObject *pf_allgather(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return sr_call(args, n, SR_ALLGATHER);
}

/* remember_rooted(state, which, root, sspec, sarr, sdt, smode, rspec, rarr,
 *                 rdt, rmode, op, count, opc, dtc, sflags, rflags, env, envkey,
 *                 cfg, hints[, weak]): Python found this Gather (which 0), Scatter
 * (1) or Reduce (2) one for erdma_coll_gather / _scatter (count: block
 * bytes) / _reduce (count elements, opc, dtc); smode / rmode as in pf_coll
 * (the array arguments None where not 2); weak: the array sides by their
 * layouts (mode 3), the arrays not kept. */
static PyObject *pf_remember_rooted(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 21 && n != 22) {
    PyErr_SetString(PyExc_TypeError, "remember_rooted() takes 21 or 22 arguments");
    return NULL;
  }
  int weak = n == 22 ? PyObject_IsTrue(args[21]) : 0;
  if (weak < 0) return NULL;
  pf_state *s = state_of(args[0]);
  long which = PyLong_AsLong(args[1]), root = PyLong_AsLong(args[2]);
  long smode = PyLong_AsLong(args[6]), rmode = PyLong_AsLong(args[10]);
  unsigned long long count = PyLong_AsUnsignedLongLong(args[12]);
  long opc = PyLong_AsLong(args[13]), dtc = PyLong_AsLong(args[14]);
  long sflags = PyLong_AsLong(args[15]), rflags = PyLong_AsLong(args[16]);
  if (PyErr_Occurred()) return NULL;
  if (!s || which < 0 || which > 2 || root < 0 || root >= s->size || smode < 0 ||
      smode > 2 || rmode < 0 || rmode > 2 || (smode == 2) != (args[4] != Py_None) ||
      (rmode == 2) != (args[8] != Py_None) || !PyDict_Check(args[17]) ||
      !PyDict_Check(args[20]))
    Py_RETURN_FALSE;
  pf_coll *slot = &s->rooted[which];
  if (slot->busy) Py_RETURN_FALSE;
  PyObject *mode = PyObject_GetAttrString(args[19], "mode");
  if (!mode) return NULL;
  pf_coll x = {0};
  PyObject *sarr = smode == 2 ? args[4] : NULL, *rarr = rmode == 2 ? args[8] : NULL;
  if (weak) {
    /* each array side by its layout (mode 3), as remember_sr's weak */
    int ok = (!sarr || (((np_head *)sarr)->flags == (int)sflags &&
                        (sflags & NP_C_CONTIGUOUS) && layout_keep(&x.sl, sarr))) &&
             (!rarr || (((np_head *)rarr)->flags == (int)rflags &&
                        (rflags & (NP_C_CONTIGUOUS | NP_WRITEABLE)) ==
                            (NP_C_CONTIGUOUS | NP_WRITEABLE) &&
                        layout_keep(&x.rl, rarr)));
    if (!ok) {
      layout_clear(&x.sl);
      layout_clear(&x.rl);
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
    if (sarr) smode = 3;
    if (rarr) rmode = 3;
    sarr = rarr = NULL;
  } else {
    if (sarr && !coll_view(sarr, sflags, NP_C_CONTIGUOUS, 0, &x.sview)) {
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
    if (rarr && !coll_view(rarr, rflags, NP_C_CONTIGUOUS | NP_WRITEABLE, 1, &x.rview)) {
      if (sarr) PyBuffer_Release(&x.sview);
      Py_DECREF(mode);
      Py_RETURN_FALSE;
    }
  }
  coll_clear(slot);
  x.have = 1;
  x.weak = weak;
  x.sspec = smode == 3 ? NULL : Py_NewRef(args[3]);
  x.sarr = sarr ? Py_NewRef(sarr) : NULL;
  x.sdt = args[5] == Py_None ? NULL : Py_NewRef(args[5]);
  x.rspec = rmode == 3 ? NULL : Py_NewRef(args[7]);
  x.rarr = rarr ? Py_NewRef(rarr) : NULL;
  x.rdt = args[9] == Py_None ? NULL : Py_NewRef(args[9]);
  x.op = Py_NewRef(args[11]);
  x.count = count;
  x.opc = (int)opc;
  x.dtc = (int)dtc;
  x.root = (int)root;
  x.smode = (int)smode;
  x.rmode = (int)rmode;
  coll_keep_checks(&x, args[17], args[18], args[19], mode, args[20]);
  *slot = x;
  Py_RETURN_TRUE;
}

/* One side of a remembered rooted call still what it was (see pf_coll):
 * for a side by layout (mode 3), its array exported into *v (*got 1). */
static int rooted_side(PyObject *spec, int mode, PyObject *want, PyObject *arr, PyObject *dt,
                       const pf_layout *l, int need, Py_buffer *v, int *got) {
  *got = 0;
  if (mode == 0) return 1;
  if (mode == 1) return spec == want;
  if (mode == 3) {
    PyObject *a = weak_array(spec, l, dt, need);
    if (!a || PyObject_GetBuffer(a, v, (need & NP_WRITEABLE) ? PyBUF_WRITABLE : PyBUF_SIMPLE)) {
      PyErr_Clear();
      return 0;
    }
    *got = 1;
    return 1;
  }
  return spec_is(spec, want, arr, dt) &&
         (((np_head *)(dt ? arr : spec))->flags & need) == need;
}

static PyObject *rooted_pair(pf_state *s, int scatter, void *sb, void *rb, uint64_t blk,
                             int root, long tag);

/* The engine call of a remembered rooted call on buffers sb / rb. */
static PyObject *rooted_run(pf_state *s, pf_coll *x, int which, int root, long tag, void *sb,
                            void *rb) {
  erdma_coll *pending = NULL;
  PyObject *res;
  x->busy++;
  if (which < 2 && s->size == 2 && (s->me == root ? (which ? sb : rb) : (which ? rb : sb))) {
    res = rooted_pair(s, which, sb, rb, x->count, root, tag);
    x->busy--;
    return res;
  }
  PyThreadState *ts = PyEval_SaveThread();
  int rc;
  if (which == 2)
    rc = erdma_coll_reduce(s->e, sb, rb, x->count, x->opc, x->dtc, root, s->ranks, s->size,
                           s->me, (int)tag, s->ctx + 1, s->slice, &pending);
  else
    rc = (which == 0 ? erdma_coll_gather : erdma_coll_scatter)(
        s->e, sb, rb, x->count, root, s->ranks, s->size, s->me, (int)tag, s->ctx + 1,
        s->slice, &pending);
  PyEval_RestoreThread(ts);
  x->busy--;
  return coll_result(rc, pending);
}

/* rooted(state, which, sendbuf, recvbuf, root, op) -> 0 | 1 (miss) |
 * (rc, pending), as allreduce; op None for Gather and Scatter */
static PyObject *pf_rooted(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pf_state *s;
  long which, root, tag;
  if (n != 6 || !(s = state_of(args[0])) || !small_int(args[1], 0, 2, &which) ||
      !small_int(args[4], 0, s->size - 1, &root))
    return PyLong_FromLong(1);
  pf_coll *x = &s->rooted[which];
  if (!x->have || x->busy || root != x->root || args[5] != x->op || !coll_still(x))
    return PyLong_FromLong(1);
  Py_buffer sv, rv;
  int sgot, rgot = 0;
  PyObject *res;
  if (!rooted_side(args[2], x->smode, x->sspec, x->sarr, x->sdt, &x->sl, NP_C_CONTIGUOUS, &sv,
                   &sgot) ||
      !rooted_side(args[3], x->rmode, x->rspec, x->rarr, x->rdt, &x->rl,
                   NP_C_CONTIGUOUS | NP_WRITEABLE, &rv, &rgot) ||
      /* new arrays that share memory: Python checks them */
      (sgot && rgot && views_overlap(&sv, &rv)))
    res = PyLong_FromLong(1);
  else if ((tag = next_coll_tag(s)) < 0)
    res = tag == -1 ? NULL : PyLong_FromLong(1);
  else {
    if (rgot) fresh_pages(rv.buf, rv.len);
    res = rooted_run(s, x, (int)which, (int)root, tag,
                     sgot ? sv.buf : x->sarr ? x->sview.buf : NULL,
                     rgot ? rv.buf : x->rarr ? x->rview.buf : NULL);
  }
  if (sgot) PyBuffer_Release(&sv);
  if (rgot) PyBuffer_Release(&rv);
  return res;
}

/* remember_bcast(state, spec, arr, dt, flags, env, envkey, cfg, hints[, weak]):
 * Python found this Bcast one for erdma_coll_bcast (dt None: the spec is
 * arr); weak: any array of arr's layout, not kept (see pf_coll). */
static PyObject *pf_remember_bcast(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 9 && n != 10) {
    PyErr_SetString(PyExc_TypeError, "remember_bcast() takes 9 or 10 arguments");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  long flags = PyLong_AsLong(args[4]);
  int weak = n == 10 ? PyObject_IsTrue(args[9]) : 0;
  if (PyErr_Occurred()) return NULL;
  if (!s || s->bc.busy || !PyDict_Check(args[5]) || !PyDict_Check(args[8]) || weak < 0)
    Py_RETURN_FALSE;
  PyObject *mode = PyObject_GetAttrString(args[7], "mode");
  if (!mode) return NULL;
  pf_coll x = {0};
  int need = NP_C_CONTIGUOUS | NP_WRITEABLE;
  if (weak ? ((np_head *)args[2])->flags != (int)flags || (flags & need) != need ||
                 !layout_keep(&x.rl, args[2])
           : !coll_view(args[2], flags, need, 1, &x.rview)) {
    Py_DECREF(mode);
    Py_RETURN_FALSE;
  }
  coll_clear(&s->bc);
  x.have = 1;
  x.weak = weak;
  if (!weak) {
    x.rspec = Py_NewRef(args[1]);
    x.rarr = Py_NewRef(args[2]);
  }
  x.rdt = args[3] == Py_None ? NULL : Py_NewRef(args[3]);
  coll_keep_checks(&x, args[5], args[6], args[7], mode, args[8]);
  s->bc = x;
  Py_RETURN_TRUE;
}

/* Wait for a collective's request posted without the collective's state,
 * in slices with signal checks between them (without: a wait whose abandon
 * would leave the two ranks knowing different things, as a Barrier that
 * offered flags, see pf_barrier; a failed peer still ends it); frees it.
 * The error it ended with (or erdma_req_wait's), or PF_SIGNALLED with a
 * signal's exception set (the request withdrawn). */
static int wait_signals(pf_state *s, erdma_req *r, int signals) {
  erdma_status st;
  int rc;
  for (;;) {
    PyThreadState *ts = PyEval_SaveThread();
    rc = erdma_req_wait(r, s->slice, &st);
    PyEval_RestoreThread(ts);
    if (rc != ERDMA_ERR_TIMEOUT) break;
    if (signals && PyErr_CheckSignals()) {
      erdma_req_abort(r);
      erdma_req_free(r);
      return PF_SIGNALLED;
    }
  }
  if (rc) erdma_req_abort(r);
  erdma_req_free(r);
  return rc ? rc : st.error;
}

static int wait_one(pf_state *s, erdma_req *r) { return wait_signals(s, r, 1); }

/* One receive of a collective's message, without the collective's state;
 * answers as erdma_coll_* would (0, or an error as (rc, 0)); a signal's
 * exception between slices withdraws the receive. */
static PyObject *recv_one(pf_state *s, void *buf, uint64_t len, int src, long tag) {
  erdma_req *r = NULL;
  erdma_blocking now;
  if (erdma_recv_now(s->e, buf, len, src, (int)tag, s->ctx + 1, &now))
    return coll_result(now.error, NULL); /* (its block arrived first) */
  int rc = erdma_irecv(s->e, buf, len, src, (int)tag, s->ctx + 1, 0, &r);
  if (rc) return coll_result(rc, NULL);
  rc = wait_one(s, r);
  return rc == PF_SIGNALLED ? NULL : coll_result(rc, NULL);
}

/* One send of a collective's message, without the collective's state: into
 * the peer's ring when it fits (flags as erdma_shm_try_send's), else posted
 * and waited for; answers as recv_one. */
static PyObject *send_one(pf_state *s, const void *buf, uint64_t len, int dest, long tag,
                          int flags) {
  if (erdma_shm_try_send(s->e, buf, len, dest, (int)tag, s->ctx + 1, flags))
    return PyLong_FromLong(0);
  erdma_req *r = NULL;
  int rc = erdma_isend(s->e, buf, len, dest, (int)tag, s->ctx + 1, flags, &r);
  if (rc) return coll_result(rc, NULL);
  rc = wait_one(s, r);
  return rc == PF_SIGNALLED ? NULL : coll_result(rc, NULL);
}

/* The linear Gather / Scatter of two ranks (erdma_coll_gather / _scatter's
 * one message and the root's own block) without the collective's state. */
static PyObject *rooted_pair(pf_state *s, int scatter, void *sb, void *rb, uint64_t blk,
                             int root, long tag) {
  uint8_t *all = scatter ? sb : rb; /* the root's two blocks */
  uint8_t *one = scatter ? rb : sb; /* a rank's block; NULL at the root: in place */
  int peer = 1 - s->me;
  if (blk == 0) return PyLong_FromLong(0);
  if (s->me != root)
    return scatter ? recv_one(s, one, blk, s->ranks[root], tag)
                   : send_one(s, one, blk, s->ranks[root], tag, 0);
  uint8_t *mine = all + (uint64_t)s->me * blk, *theirs = all + (uint64_t)peer * blk;
  if (one && one != mine) {
    if (scatter) erdma_copy(one, mine, blk);
    else erdma_copy(mine, one, blk);
  }
  return scatter ? send_one(s, theirs, blk, s->ranks[peer], tag, 0)
                 : recv_one(s, theirs, blk, s->ranks[peer], tag);
}

/* A two-rank communicator whose ranks agreed on flags at an earlier Barrier
 * (pf_barrier): 1 with s->pair its slot. */
static int pair_of(pf_state *s) {
  uint32_t cctx = s->ctx + 1;
  unsigned gen = erdma_pair_gen(s->e);
  if (gen != s->pair_gen) { /* a pair agreed or forgotten since: ours, by another object? */
    s->pair = erdma_pair_find(s->e, s->ranks[1 - s->me], cctx);
    s->pair_gen = gen;
  }
  return s->pair >= 0 && erdma_pair_is(s->e, s->pair, cctx);
}

/* erdma_pair_wait on s->pair: the peer is usually a moment behind, so look
 * for it keeping the GIL first, then wait in slices with signal checks
 * between them.  0, the peer's error, or PF_SIGNALLED (exception set). */
static int pair_wait(pf_state *s) {
  if (erdma_pair_poll(s->e, s->pair, 64)) return 0;
  for (;;) {
    PyThreadState *ts = PyEval_SaveThread();
    int rc = erdma_pair_wait(s->e, s->pair, s->slice);
    PyEval_RestoreThread(ts);
    if (rc != ERDMA_ERR_TIMEOUT) return rc;
    if (PyErr_CheckSignals()) return PF_SIGNALLED;
  }
}

/* pair_wait as an erdma_pair_waiter (erdma.h), the GIL released around
 * long copies: the two-rank protocols of erdma_coll.c with signal checks */
static int pf_pair_wait(void *arg, erdma_engine *e, int slot) {
  return pair_wait((pf_state *)arg);
}
static void *pf_release(void *arg) {
  return PyEval_SaveThread();
}
static void pf_acquire(void *arg, void *token) {
  PyEval_RestoreThread(token);
}
#define PF_WAITER(s) \
  (&(const erdma_pair_waiter){pf_pair_wait, pf_release, pf_acquire, (s), PF_SIGNALLED})

static PyObject *pair_result(int rc) {
  return rc == PF_SIGNALLED ? NULL : coll_result(rc, NULL);
}

/* A Bcast of two ranks that agreed on flags (erdma_pair_bcast) */
static PyObject *pair_bcast(pf_state *s, void *buf, uint64_t len, int root) {
  return pair_result(erdma_pair_bcast(s->e, s->pair, buf, len, s->me == root, PF_WAITER(s)));
}

/* An Allgather by flags; sb NULL: in place */
static PyObject *pair_allgather(pf_state *s, const void *sb, void *rb, uint64_t blk) {
  uint8_t *mine = (uint8_t *)rb + (uint64_t)s->me * blk;
  if (sb && sb != mine) memcpy(mine, sb, blk);
  return pair_result(erdma_pair_exchange(s->e, s->pair, mine,
                                         (uint8_t *)rb + (uint64_t)(1 - s->me) * blk, blk, NULL,
                                         NULL, 0, PF_WAITER(s)));
}

/* An Alltoall by flags (and CMA above ERDMA_PAIR_DATA_MAX); sb NULL: in place */
static PyObject *pair_alltoall(pf_state *s, const void *sb, void *rb, uint64_t blk) {
  int rc = erdma_pair_alltoall(s->e, s->pair, sb, rb, blk, s->me, PF_WAITER(s));
  return rc == ERDMA_ERR_NOMEM ? PyErr_NoMemory() : pair_result(rc);
}

/* bcast(state, buf, root) -> 0 | 1 (miss) | (rc, pending).  The root of two
 * ranks hands its one message of the binomial tree to the peer's ring
 * itself when it fits there, as erdma_coll_bcast would. */
static PyObject *bcast_run(pf_state *s, pf_coll *x, void *buf, uint64_t len, long root);

static PyObject *pf_bcast(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pf_state *s;
  long root;
  if (n != 3 || !(s = state_of(args[0]))) return PyLong_FromLong(1);
  pf_coll *x = &s->bc;
  int need = NP_C_CONTIGUOUS | NP_WRITEABLE;
  if (!x->have || x->busy || !small_int(args[2], 0, s->size - 1, &root) || !coll_still(x))
    return PyLong_FromLong(1);
  if (x->weak) { /* any array of the layout: exported for the call */
    PyObject *a = weak_array(args[1], &x->rl, x->rdt, need);
    Py_buffer v;
    if (!a || PyObject_GetBuffer(a, &v, PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      return PyLong_FromLong(1);
    }
    if (root != s->me) fresh_pages(v.buf, v.len);
    PyObject *res = bcast_run(s, x, v.buf, (uint64_t)v.len, root);
    PyBuffer_Release(&v);
    return res;
  }
  if (!spec_is(args[1], x->rspec, x->rarr, x->rdt) ||
      (((np_head *)(x->rdt ? x->rarr : args[1]))->flags & need) != need)
    return PyLong_FromLong(1);
  return bcast_run(s, x, x->rview.buf, (uint64_t)x->rview.len, root);
}

/* pf_bcast's call on the memory found for it */
static PyObject *bcast_run(pf_state *s, pf_coll *x, void *buf, uint64_t len, long root) {
  long tag = next_coll_tag(s);
  if (tag < 0) return tag == -1 ? NULL : PyLong_FromLong(1);
  if (s->size == 2 && len > 0 && len < ERDMA_PAIR_BCAST_MAX && pair_of(s)) {
    x->busy++;
    PyObject *res = pair_bcast(s, buf, len, (int)root);
    x->busy--;
    return res;
  }
  if (s->size == 2 && s->me == root &&
      erdma_shm_try_send(s->e, buf, len, s->ranks[1 - root], (int)tag, s->ctx + 1,
                         ERDMA_SEND_BULK))
    return PyLong_FromLong(0);
  if (s->size == 2 && s->me != root) {
    /* the other rank of two: the binomial tree's one receive, without the
     * collective's state */
    x->busy++;
    PyObject *res = recv_one(s, buf, len, s->ranks[root], tag);
    x->busy--;
    return res;
  }
  erdma_coll *pending = NULL;
  x->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_coll_bcast(s->e, buf, len, (int)root, s->ranks, s->size, s->me, (int)tag,
                            s->ctx + 1, s->slice, &pending);
  PyEval_RestoreThread(ts);
  x->busy--;
  return coll_result(rc, pending);
}

/* remember_barrier(state, env, envkey): Python found this communicator's
 * Barrier one for erdma_coll_barrier while envkey is not in env. */
static PyObject *pf_remember_barrier(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 3) {
    PyErr_SetString(PyExc_TypeError, "remember_barrier() takes 3 arguments");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  if (!s || !PyDict_Check(args[1])) Py_RETURN_FALSE;
  PyObject *env = s->bar_env, *key = s->bar_key;
  s->bar_env = Py_NewRef(args[1]);
  s->bar_key = Py_NewRef(args[2]);
  Py_XDECREF(env);
  Py_XDECREF(key);
  Py_RETURN_TRUE;
}

/* barrier(state) -> 0 | 1 (miss) | (rc, pending) */
static PyObject *pf_barrier(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pf_state *s;
  if (n != 1 || !(s = state_of(args[0])) || !s->bar_env) return PyLong_FromLong(1);
  int has = PyDict_Contains(s->bar_env, s->bar_key);
  if (has != 0) {
    PyErr_Clear();
    return PyLong_FromLong(1);
  }
  long tag = next_coll_tag(s);
  if (tag < 0) return tag == -1 ? NULL : PyLong_FromLong(1);
  if (s->size == 2) {
    int peer = s->ranks[1 - s->me], rc;
    uint32_t cctx = s->ctx + 1;
    if (pair_of(s)) {
      erdma_pair_arrive(s->e, s->pair);
      rc = pair_wait(s);
      return rc == PF_SIGNALLED ? NULL : coll_result(rc, NULL);
    }
    /* the dissemination's one round (1-byte tokens) without the
     * collective's state; the token offers flags for the Barriers to come.
     * It goes first, straight into a local peer's ring where it fits: the
     * peer's wait ends sooner by the cost of posting our receive.  A peer
     * that never offers (its slots taken, no fast path) would make every
     * such Barrier wait through signals (below): offer a few times only */
    uint8_t token = s->pair_refused < PAIR_OFFERS ? (uint8_t)erdma_pair_offer(s->e, peer, cctx) : 0;
    uint8_t got = 0;
    erdma_req *r = NULL, *sr = NULL;
    if (!erdma_shm_try_send(s->e, &token, 1, peer, (int)tag, cctx, 0) &&
        (rc = erdma_isend(s->e, &token, 1, peer, (int)tag, cctx, 0, &sr))) {
      if (token) erdma_pair_settle(s->e, cctx, token, 0);
      return coll_result(rc, NULL);
    }
    if ((rc = erdma_irecv(s->e, &got, 1, peer, (int)tag, cctx, 0, &r))) {
      if (sr) {
        erdma_req_abort(sr);
        erdma_req_free(sr);
      }
      if (token) erdma_pair_settle(s->e, cctx, token, 0);
      return coll_result(rc, NULL);
    }
    /* With an offer out, the peer decides once it has both tokens: a wait
     * we left on a signal would leave us without its token, deciding
     * otherwise.  So that one Barrier per communicator runs to its end (or
     * to the peer's failure) and the signal's handler runs after it. */
    rc = wait_signals(s, r, !token);
    if (sr) {
      if (rc) { /* the receive failed or a signal came: withdraw the send too */
        erdma_req_abort(sr);
        erdma_req_free(sr);
      } else {
        rc = wait_signals(s, sr, !token);
      }
    }
    if (token) { /* both now know both tokens: the same answer on both sides */
      s->pair = erdma_pair_settle(s->e, cctx, token, rc ? 0 : got);
      s->pair_gen = erdma_pair_gen(s->e);
      if (s->pair < 0 && !rc) s->pair_refused++;
      if (!rc && PyErr_CheckSignals()) return NULL;
    }
    return rc == PF_SIGNALLED ? NULL : coll_result(rc, NULL);
  }
  erdma_coll *pending = NULL;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_coll_barrier(s->e, s->ranks, s->size, s->me, (int)tag, s->ctx + 1, s->slice,
                              &pending);
  PyEval_RestoreThread(ts);
  return coll_result(rc, pending);
}

/* A collective's message (the optional last argument `base`, its tag base):
 * the communicator's collective context, tag base + tag (tag < 1024). */
static int coll_tag(pf_state *s, PyObject *const *args, Py_ssize_t n, Py_ssize_t at, long *tag,
                    uint32_t *ctx) {
  long base;
  *ctx = s->ctx;
  if (n == at) return 1;
  if (n != at + 1 || !small_int(args[at], 0, (SEQ_MOD - 1) * COLL_TAGS, &base) ||
      *tag < 0 || *tag >= COLL_TAGS)
    return 0;
  *tag += base;
  *ctx = s->ctx + 1;
  return 1;
}

/* send_bytes(state, data, dest, tag[, base]): a pickled object (exact bytes)
 * as an eager message into a local peer's ring: 0 done, 1 miss (anything
 * else: another host, a full ring, a large object; nothing done). */
static PyObject *pf_send_bytes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long dest, tag;
  uint32_t ctx;
  pf_state *s;
  if (n < 4 || !(s = state_of(args[0])) || !PyBytes_CheckExact(args[1]) ||
      !small_int(args[2], 0, s->size - 1, &dest) || !small_int(args[3], 0, s->tag_ub, &tag) ||
      !coll_tag(s, args, n, 4, &tag, &ctx))
    return PyLong_FromLong(1);
  char *buf = PyBytes_AsString(args[1]);
  Py_ssize_t len = PyBytes_Size(args[1]);
  if (!buf || len < 0) {
    PyErr_Clear();
    return PyLong_FromLong(1);
  }
  return PyLong_FromLong(
      erdma_shm_try_send(s->e, buf, (uint64_t)len, s->ranks[dest], (int)tag, ctx, 0) ? 0 : 1);
}

/* The pickling of send_obj: dumps(obj, protocol[, buffer_callback=cb]),
 * where cb (one object, oob_cb) keeps a PickleBuffer of fewer than
 * `threshold` bytes in band, as msgpickle._OobBuffers does, and stops the
 * pickling at a larger one (exception oob_stop): such an object travels as
 * Python's out-of-band frame instead (pickled again there: its __reduce__
 * runs twice, the price of not scanning every object for buffers first). */
typedef struct {
  PyObject_HEAD
  Py_ssize_t threshold;
  int busy; /* in a dumps (another thread's send takes Python's path) */
} pf_oobcb;

static PyObject *oob_type, *oob_cb, *oob_kw, *oob_stop;

static PyObject *oobcb_call(PyObject *self, PyObject *args, PyObject *kw) {
  PyObject *pb;
  Py_buffer v;
  if (kw || !PyArg_UnpackTuple(args, "buffer_callback", 1, 1, &pb)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "buffer_callback(pb)");
    return NULL;
  }
  if (PyObject_GetBuffer(pb, &v, PyBUF_FULL_RO) < 0) return NULL;
  Py_ssize_t len = v.len;
  PyBuffer_Release(&v);
  if (len < ((pf_oobcb *)self)->threshold) Py_RETURN_TRUE;
  PyErr_SetNone(oob_stop);
  return NULL;
}

static PyType_Slot oobcb_slots[] = {{Py_tp_call, oobcb_call}, {0, NULL}};
static PyType_Spec oobcb_spec = {"erdmampi._erdma_fast.OobCallback", sizeof(pf_oobcb), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                 oobcb_slots};

/* Types whose pickle holds no buffer (msgpickle._NO_BUFFERS, less complex),
 * by their exact type. */
static inline int plain_object(PyObject *o) {
  PyTypeObject *t = Py_TYPE(o);
  return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type || o == Py_None ||
         t == &PyBytes_Type || t == &PyBool_Type;
}

/* A small record: plain objects, and lists, tuples and dicts of at most
 * NB_ITEMS such items, `depth` deep (pickled without a buffer callback,
 * whose keyword call costs as much as the rest of the check).  Only a guess
 * that saves time: an object it misses is pickled in band, which is what
 * the callback would have chosen for every buffer below the threshold, and
 * still correct above it.  So a dict's keys (hashable: no array) are not
 * looked at, and each item is tested inline before any call (this check
 * took 45 ns for a 3-item dict, 28 so). */
#define NB_ITEMS 16
static int no_buffers(PyObject *o, int depth) {
  if (plain_object(o)) return 1;
  if (depth <= 0) return 0;
  PyTypeObject *t = Py_TYPE(o);
  if (t == &PyDict_Type) {
    PyObject *k, *v;
    Py_ssize_t at = 0;
    if (PyDict_Size(o) > NB_ITEMS) return 0;
    while (PyDict_Next(o, &at, &k, &v))
      if (!plain_object(v) && !no_buffers(v, depth - 1)) return 0;
    return 1;
  }
  if (t == &PyList_Type || t == &PyTuple_Type) {
    int list = t == &PyList_Type;
    Py_ssize_t n = list ? PyList_Size(o) : PyTuple_Size(o);
    if (n > NB_ITEMS) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *x = list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);
      if (!plain_object(x) && !no_buffers(x, depth - 1)) return 0;
    }
    return 1;
  }
  return 0;
}

/* The pickle of obj for wire (dumps, protocol, threshold): new bytes, NULL
 * with an exception, or NULL without one: Python encodes it (a large
 * buffer inside, or another thread pickling). */
static PyObject *dumps_wire(PyObject *obj, PyObject *wire) {
  PyObject *dumps, *proto;
  long protocol;
  Py_ssize_t threshold;
  if (!PyTuple_CheckExact(wire) || PyTuple_Size(wire) != 3 || !oob_cb) return NULL;
  dumps = PyTuple_GetItem(wire, 0);
  proto = PyTuple_GetItem(wire, 1);
  if (!small_int(proto, 0, 1000, &protocol) || !PyLong_CheckExact(PyTuple_GetItem(wire, 2)))
    return NULL;
  threshold = PyLong_AsSsize_t(PyTuple_GetItem(wire, 2));
  if (threshold == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return NULL;
  }
  PyObject *data;
  if (protocol < 5 || no_buffers(obj, 3)) {
    data = PyObject_CallFunctionObjArgs(dumps, obj, proto, NULL);
  } else {
    pf_oobcb *cb = (pf_oobcb *)oob_cb;
    PyObject *a = cb->busy ? NULL : PyTuple_Pack(2, obj, proto);
    if (!a) return NULL;
    cb->threshold = threshold;
    cb->busy = 1;
    data = PyObject_Call(dumps, a, oob_kw);
    cb->busy = 0;
    Py_DECREF(a);
    if (!data && PyErr_ExceptionMatches(oob_stop)) PyErr_Clear();
  }
  if (data && !PyBytes_CheckExact(data)) Py_CLEAR(data); /* not pickle.dumps' */
  return data;
}

/* send_obj(state, obj, dest, tag, wire[, base]): send_bytes of obj pickled
 * here (wire: msgpickle.Pickle._wire, a tuple, or None): 0 sent; the
 * pickle (bytes) not sent; 1 miss: Python encodes (not picklable here). */
static PyObject *send_obj_flags(PyObject *const *args, Py_ssize_t n, int flags);
static PyObject *pf_send_obj(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  return send_obj_flags(args, n, 0);
}

/* send_obj with erdma_shm_try_send's flags (sendrecv_obj: ERDMA_SEND_EXCHANGE) */
static PyObject *send_obj_flags(PyObject *const *args, Py_ssize_t n, int flags) {
  long dest, tag;
  uint32_t ctx;
  pf_state *s;
  if (n < 5 || !(s = state_of(args[0])) || !small_int(args[2], 0, s->size - 1, &dest) ||
      !small_int(args[3], 0, s->tag_ub, &tag) || !coll_tag(s, args, n, 5, &tag, &ctx))
    return PyLong_FromLong(1);
  PyObject *data = dumps_wire(args[1], args[4]);
  if (!data) return PyErr_Occurred() ? NULL : PyLong_FromLong(1);
  char *buf = PyBytes_AsString(data);
  Py_ssize_t len = PyBytes_Size(data);
  if (buf && len >= 0 &&
      erdma_shm_try_send(s->e, buf, (uint64_t)len, s->ranks[dest], (int)tag, ctx, flags)) {
    Py_DECREF(data);
    return PyLong_FromLong(0);
  }
  PyErr_Clear();
  return data;
}

/* The receive of recv_bytes / recv_obj: args (state, source, tag, ...),
 * a call tag base at args[at] if present.  1: completed, with *reqp (its
 * payload allocated by the engine; erdma_req_free after) and *st; 0: done
 * here, *res is the answer (1 miss, (rc, left) as recv, or NULL with an
 * exception). */
static int recv_alloc_at(pf_state *s, int src, long tag, uint32_t ctx, erdma_req **reqp,
                         erdma_status *st, PyObject **res);

/* A receive's arguments (state, source, tag, ..., a call tag base at
 * args[at] if present): 1 with the state, the source's world rank
 * (ANY_SOURCE kept), the tag and the context; 0: a miss. */
static int recv_args(PyObject *const *args, Py_ssize_t n, Py_ssize_t at, pf_state **sp, int *src,
                     long *tag, uint32_t *ctx) {
  long r;
  pf_state *s;
  if (n < at || !(s = state_of(args[0])) ||
      !small_int(args[1], ERDMA_ANY_SOURCE, s->size - 1, &r) || r == -1 ||
      !small_int(args[2], ERDMA_ANY_TAG, s->tag_ub, tag) || !coll_tag(s, args, n, at, tag, ctx))
    return 0;
  *sp = s;
  *src = r == ERDMA_ANY_SOURCE ? ERDMA_ANY_SOURCE : s->ranks[r];
  return 1;
}

static int recv_alloc(PyObject *const *args, Py_ssize_t n, Py_ssize_t at, erdma_req **reqp,
                      erdma_status *st, PyObject **res) {
  long tag;
  uint32_t ctx;
  int src;
  pf_state *s;
  if (!recv_args(args, n, at, &s, &src, &tag, &ctx)) {
    *res = PyLong_FromLong(1);
    return 0;
  }
  return recv_alloc_at(s, src, tag, ctx, reqp, st, res);
}

/* recv_alloc's receive from world rank src (or ANY_SOURCE). */
static int recv_alloc_at(pf_state *s, int src, long tag, uint32_t ctx, erdma_req **reqp,
                         erdma_status *st, PyObject **res) {
  erdma_req *req = NULL;
  int rc = erdma_irecv(s->e, NULL, 0, src, (int)tag, ctx, 1, &req);
  if (rc) {
    *res = Py_BuildValue("(iK)", rc, 0ull);
    return 0;
  }
  PyThreadState *ts = PyEval_SaveThread();
  rc = erdma_req_wait(req, s->slice, st);
  while (rc == ERDMA_ERR_PEER_PENDING) { /* blocking from ANY_SOURCE: fails (ULFM) */
    erdma_req_withdraw_failed(req);
    rc = erdma_req_wait(req, s->slice, st);
  }
  PyEval_RestoreThread(ts);
  if (rc == ERDMA_ERR_TIMEOUT &&
      (*res = Py_BuildValue("(iK)", rc, (unsigned long long)(uintptr_t)req)))
    return 0;
  if (rc) { /* failed, or pending with no answer to hand it over in: withdrawn */
    erdma_req_abort(req);
    erdma_req_free(req);
    if (rc != ERDMA_ERR_TIMEOUT) *res = Py_BuildValue("(iK)", rc, 0ull);
    return 0;
  }
  *reqp = req;
  return 1;
}

/* recv_bytes(state, source, tag[, base]): a message of any size, as bytes:
 * (bytes or None, error) when it completed, 1 miss, or (rc, left) as recv
 * (left: the engine's alloc receive, still pending). */
static PyObject *pf_recv_bytes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  erdma_req *req;
  erdma_status st;
  PyObject *res;
  if (!recv_alloc(args, n, 3, &req, &st, &res)) return res;
  PyObject *b = st.error ? Py_NewRef(Py_None)
                         : PyBytes_FromStringAndSize(erdma_req_data(req), (Py_ssize_t)st.nbytes);
  erdma_req_free(req);
  if (!b) return NULL;
  return Py_BuildValue("(Ni)", b, st.error);
}

/* recv_obj's answers other than an object: a More holding the answer of
 * recv_bytes (a type of its own, which no object unpickled here can be
 * without a pickle naming it). */
typedef struct {
  PyObject_HEAD
  PyObject *value;
} pf_more;

static PyObject *more_type;

static void more_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_CLEAR(((pf_more *)self)->value);
  freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  f(self);
  Py_DECREF(tp);
}
static PyObject *more_get_value(PyObject *self, void *c) {
  PyObject *v = ((pf_more *)self)->value;
  return Py_NewRef(v ? v : Py_None);
}
static PyGetSetDef more_getset[] = {{"value", more_get_value, NULL, NULL, NULL},
                                    {NULL, NULL, NULL, NULL, NULL}};
static PyType_Slot more_slots[] = {
    {Py_tp_dealloc, more_dealloc}, {Py_tp_getset, more_getset}, {0, NULL}};
static PyType_Spec more_spec = {"erdmampi._erdma_fast.More", sizeof(pf_more), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                more_slots};

/* A More holding `value` (stolen). */
static PyObject *more_new(PyObject *value) {
  if (!value) return NULL;
  PyTypeObject *tp = (PyTypeObject *)more_type;
  allocfunc a = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
  pf_more *m = (pf_more *)a(tp, 0);
  if (!m) {
    Py_DECREF(value);
    return NULL;
  }
  m->value = value;
  return (PyObject *)m;
}

/* An object's payload b (stolen) as recv_obj answers it: 1 and *out, the
 * object loads made of an in-band pickle; 0 and *out, recv_bytes' answer
 * (b, 0) for Python to finish (no loads here, nothing, or an out-of-band
 * frame); -1: an exception (from loads). */
static int load_bytes(PyObject *b, PyObject *loads, PyObject **out) {
  static const char magic[8] = {0, 'E', 'R', 'D', 'M', 'A', '5', 0}; /* msgpickle.MAGIC */
  Py_ssize_t nb = PyBytes_Size(b);
  if (!loads || nb <= 0 ||
      (nb >= (Py_ssize_t)sizeof magic && !memcmp(PyBytes_AsString(b), magic, sizeof magic))) {
    *out = Py_BuildValue("(Ni)", b, 0);
    return *out ? 0 : -1;
  }
  *out = PyObject_CallFunctionObjArgs(loads, b, NULL);
  Py_DECREF(b);
  return *out ? 1 : -1;
}

/* The object in a completed alloc receive (freed here), as load_bytes;
 * a failed receive: 0 and *out (None, error). */
static int load_payload(erdma_req *req, const erdma_status *st, PyObject *loads,
                        PyObject **out) {
  *out = NULL;
  if (st->error) {
    erdma_req_free(req);
    *out = Py_BuildValue("(Oi)", Py_None, st->error);
    return *out ? 0 : -1;
  }
  PyObject *b = PyBytes_FromStringAndSize(erdma_req_data(req), (Py_ssize_t)st->nbytes);
  erdma_req_free(req);
  return b ? load_bytes(b, loads, out) : -1;
}

/* erdma_recv_now_alloc's buffer: a new bytes object (into *arg) */
static void *bytes_alloc(void *arg, uint64_t n) {
  PyObject *b = n <= (uint64_t)PY_SSIZE_T_MAX ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n)
                                              : NULL;
  if (!b) {
    PyErr_Clear();
    return NULL;
  }
  *(PyObject **)arg = b;
  return PyBytes_AsString(b);
}

/* How long recv_obj reads the rings itself, holding the GIL, before it
 * posts a receive and waits without it: a peer's message of an exchange
 * lands well within this; a later one waits as any receive. */
#define RECV_SOON_NS 2000u

/* recv_obj's receive from world rank src (or ANY_SOURCE), as load_bytes
 * answers: 1 and *out the object loads made; 0 and *out a value for a More
 * ((payload or None, error) for Python to finish, or (rc, left) as recv);
 * -1 an exception.  A message here whole already, or that lands within
 * RECV_SOON_NS, is copied once, into the bytes loads reads, with no request
 * and no wait. */
static int recv_obj_at(pf_state *s, int src, long tag, uint32_t ctx, PyObject *loads,
                       PyObject **out) {
  erdma_req *req;
  erdma_status st;
  erdma_blocking now;
  PyObject *b = NULL;
  if (erdma_recv_soon_alloc(s->e, src, (int)tag, ctx, bytes_alloc, &b, RECV_SOON_NS, &now))
    return load_bytes(b, loads, out);
  if (!recv_alloc_at(s, src, tag, ctx, &req, &st, out)) return *out ? 0 : -1;
  return load_payload(req, &st, loads, out);
}

/* recv_obj(state, source, tag, loads[, base]): recv_bytes of a lowercase
 * recv (with base: an object collective's message) that also unpickles: the
 * object, when loads (pickle.loads, or None: never here) took an in-band
 * pickle; else a More whose value is (payload or None, error) for Python to
 * finish (an out-of-band frame, an error), 1 (a miss) or (rc, left) as
 * recv (the receive: recv_obj_at). */
static PyObject *pf_recv_obj(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  PyObject *res, *loads = n >= 4 && args[3] != Py_None ? args[3] : NULL;
  long tag;
  uint32_t ctx;
  int src;
  pf_state *s;
  if (!recv_args(args, n, 4, &s, &src, &tag, &ctx)) return more_new(PyLong_FromLong(1));
  int rc = recv_obj_at(s, src, tag, ctx, loads, &res);
  return rc == 0 ? more_new(res) : res;
}

/* sendrecv_obj(state, obj, dest, sendtag, source, recvtag, wire, loads):
 * the method sendrecv (no recvbuf, no status): send_obj, then, once it is
 * sent, recv_obj's answer.  A send not done here answers a More whose value
 * is a 1-tuple: (the pickle, not sent,) or (1,): not pickled here; recv_obj's
 * More values are never 1-tuples. */
static PyObject *pf_sendrecv_obj(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 8) return more_new(Py_BuildValue("(i)", 1));
  PyObject *sa[5] = {args[0], args[1], args[2], args[3], args[6]};
  PyObject *r = send_obj_flags(sa, 5, ERDMA_SEND_EXCHANGE);
  if (!r) return NULL;
  if (!PyLong_CheckExact(r) || PyObject_IsTrue(r) != 0) {
    PyObject *t = PyTuple_Pack(1, r);
    Py_DECREF(r);
    return more_new(t);
  }
  Py_DECREF(r);
  PyObject *ra[4] = {args[0], args[4], args[5], args[7]};
  return pf_recv_obj(NULL, ra, 4);
}

/* pair_obj(state, send, own, recv, wire, loads, nothing[, base]): a
 * lowercase collective of a two-rank communicator in one call, its messages
 * those of the general algorithms (one, tag 0 of the call's tag base, or of
 * `base`: a call's second message): send (unless
 * it is `nothing`) pickled to the other rank, receive the other rank's
 * object (recv true), and a copy of own (unless `nothing`; pickled and
 * loaded, as the general algorithms do).  Answers the copy, the received
 * object, the two as a list in rank order, or None; else a More: 1 (a miss:
 * nothing done, not even the call counted; another size, a pickle Python
 * makes, loads not pickle.loads) or (base, send pickle not yet sent or
 * None, own pickle or None, recv_obj's More value of the receive or None)
 * for Python to finish. */
static PyObject *pf_pair_obj(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pf_state *s;
  long base = -1;
  if (n < 7 || n > 8 || !(s = state_of(args[0])) || s->size != 2 || args[5] == Py_None ||
      (n == 8 && !small_int(args[7], 0, (SEQ_MOD - 1) * COLL_TAGS, &base)))
    return more_new(PyLong_FromLong(1));
  PyObject *nothing = args[6], *loads = args[5];
  PyObject *sobj = args[1] == nothing ? NULL : args[1];
  PyObject *oobj = args[2] == nothing ? NULL : args[2];
  int recv = args[3] == Py_True;
  PyObject *sdata = NULL, *odata = NULL, *got = NULL, *other = NULL, *mine = NULL;
  if (sobj && !(sdata = dumps_wire(sobj, args[4]))) goto miss;
  if (oobj && !(odata = oobj == sobj ? Py_NewRef(sdata) : dumps_wire(oobj, args[4]))) goto miss;
  if (base < 0 && (base = next_coll_tag(s)) < 0) {
    if (base == -1) goto fail;
    goto miss;
  }
  int peer = s->ranks[1 - s->me];
  if (sdata) {
    if (!erdma_shm_try_send(s->e, PyBytes_AsString(sdata), (uint64_t)PyBytes_Size(sdata), peer,
                            (int)base, s->ctx + 1, ERDMA_SEND_EXCHANGE))
      goto rest; /* a full ring, a large pickle, another host: Python sends */
    Py_CLEAR(sdata);
  }
  if (odata) { /* before the receive: off the path of a message still to come */
    mine = PyObject_CallFunctionObjArgs(loads, odata, NULL);
    if (!mine && !recv) goto fail;
  }
  if (recv) {
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    if (odata && !mine) PyErr_Fetch(&et, &ev, &tb); /* raised once received */
    int rc; /* 2 received and loaded, 1 Python finishes (got), 0 an exception */
    int l = recv_obj_at(s, peer, base, s->ctx + 1, loads, &got);
    rc = l < 0 ? 0 : l == 0 ? 1 : 2;
    if (rc == 1) { /* Python finishes the receive, then loads the copy again */
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
      Py_CLEAR(mine);
      goto rest;
    }
    if (et) PyErr_Restore(et, ev, tb); /* the copy's error first */
    if (rc == 0 || et) goto fail;
    other = got;
    got = NULL;
  }
  Py_CLEAR(odata);
  if (mine && recv) {
    PyObject *l = PyList_New(2);
    if (!l) goto fail;
    PyList_SetItem(l, s->me, mine);
    PyList_SetItem(l, 1 - s->me, other);
    return l;
  }
  if (mine) return mine;
  if (recv) return other;
  Py_RETURN_NONE;
rest: /* (out of memory here: the MemoryError leaves an unsent message unsent) */
  return more_new(Py_BuildValue("(lNNN)", base, sdata ? sdata : Py_NewRef(Py_None),
                                odata ? odata : Py_NewRef(Py_None),
                                got ? got : Py_NewRef(Py_None)));
miss:
  Py_XDECREF(sdata);
  Py_XDECREF(odata);
  if (PyErr_Occurred()) return NULL;
  return more_new(PyLong_FromLong(1));
fail:
  Py_XDECREF(sdata);
  Py_XDECREF(odata);
  Py_XDECREF(got);
  Py_XDECREF(other);
  Py_XDECREF(mine);
  return NULL;
}


/* ---- methods: Comm's calls as C method descriptors ----
 * A Python method costs a frame around its one fast call; a method
 * descriptor (PyDescr_NewMethod) is called as directly as mpi4py's compiled
 * methods.  setup(handle_type, fast_offset, reap_list, reap, std_loads,
 * request_type, status_type) tells where a communicator keeps its state (the `fast`
 * field of erdmampi._membuf's handle base), the list of requests freed by
 * the user that wait to be reaped, the function that reaps them (called
 * first while the list is not empty, as the Python Send does), pickle.loads
 * and the Request and Status classes.  method(cls, slot, fast, nmin, nmax, none_mask,
 * defaults, order, more, full, name, doc, extra, result, names) fills slot `slot` of
 * the table below and answers the descriptor, which takes nmin..nmax
 * arguments, by position or by the keywords `names`, the last nmax - nmin
 * with defaults[:nmax - nmin].  A call whose arguments all bind so, those
 * named by none_mask (bit i: argument i) None, and with a state, calls the
 * fast function `fast` on (state, then for each item i of `order`: argument
 * i, or the constant defaults[nmax - nmin - 1 - i] for i < 0, then the
 * `extra` argument: 1 self._pkl._wire, 2 self._pkl._loads if it is
 * pickle.loads, else None, 3 both of those, 4 self._group._index).  result
 * 0: an answer 0 returns None; result 1: an answer that is not a More is
 * returned; result 2: an Op answered returns a Request of it.  Any other answer r returns
 * self.<more>(r, arguments...), the rest of the Python method; every other
 * call returns self.<full>(*args, **kwargs), the Python method itself. */
typedef PyObject *(*pf_fn)(PyObject *, PyObject *const *, Py_ssize_t);

#define PF_MAXARGS 8
typedef struct {
  pf_fn fn;
  int nmin, nmax, none_mask, norder, extra, result;
  signed char order[PF_MAXARGS];
  PyObject *dflt; /* tuple: nmax - nmin defaults, then the constants */
  PyObject *names; /* tuple: the nmax parameters' names */
  /* their items (borrowed from the tuples above), read at every call */
  PyObject *dflt_at[2 * PF_MAXARGS], *name_at[PF_MAXARGS];
  PyObject *more, *full;
  PyMethodDef def;
} pf_meth;

static PyTypeObject *handle_type;
static Py_ssize_t fast_offset;
static PyObject *reap_list, *reap, *std_loads, *str_pkl, *str_wire, *str_loads;

/* A Request of the Op `op` (as Request._new: the handle type's new, then
 * _predef False, _op, _start None). */
static PyObject *request_of(PyObject *op) {
  newfunc nf = (newfunc)PyType_GetSlot(handle_type, Py_tp_new);
  PyObject *req = nf ? nf(request_type, no_args, NULL) : NULL;
  if (req && (req_set(&slot_predef, req, str_predef, Py_False) ||
              req_set(&slot_op, req, str_op, op) || req_set(&slot_start, req, str_start, Py_None)))
    Py_CLEAR(req);
  return req;
}

static PyObject *meth_full(pf_meth *m, PyObject *self, PyObject *const *args, Py_ssize_t n,
                           PyObject *kwnames) {
  Py_ssize_t nk = kwnames ? PyTuple_Size(kwnames) : 0;
  PyObject *fn = PyObject_GetAttr(self, m->full);
  PyObject *t = fn ? PyTuple_New(n) : NULL;
  PyObject *kw = t && nk ? PyDict_New() : NULL;
  PyObject *r = NULL;
  if (!t || (nk && !kw)) goto out;
  for (Py_ssize_t i = 0; i < n; i++) PyTuple_SetItem(t, i, Py_NewRef(args[i]));
  for (Py_ssize_t i = 0; i < nk; i++)
    if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[n + i]) < 0) goto out;
  r = PyObject_Call(fn, t, kw);
out:
  Py_XDECREF(fn);
  Py_XDECREF(t);
  Py_XDECREF(kw);
  return r;
}

/* Bumped by pickle_changed() (msgpickle.Pickle._rewire: a pickle's dumps,
 * loads, protocol or threshold changed): the states' cached pickling
 * arguments are read again.  Starts at 1, above a new state's 0. */
static unsigned long pickle_gen = 1;

static PyObject *pf_pickle_changed(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  pickle_gen++;
  Py_RETURN_NONE;
}

static PyObject *meth_extra_read(int kind, PyObject *self);

/* An `extra` argument (kind 1, 2 or 4, see method) as a new reference, or
 * NULL: take the full path (no error set).  Kinds 1 and 2 from the state's
 * cache while no pickle changed (a communicator's _pkl is set once, when
 * it is made): the two attribute reads of each cost as much as a small
 * send's transport. */
static PyObject *meth_extra(int kind, PyObject *self, PyObject *state) {
  pf_state *s = state_of(state);
  if (!s) return meth_extra_read(kind, self);
  if (kind == 4) {
    if (!s->gindex && !(s->gindex = meth_extra_read(4, self))) return NULL;
    return Py_NewRef(s->gindex);
  }
  if (s->pkl_gen != pickle_gen) {
    PyObject *w = meth_extra_read(1, self), *l = w ? meth_extra_read(2, self) : NULL;
    if (!l) {
      Py_XDECREF(w);
      return NULL;
    }
    PyObject *ow = s->pkl_wire, *ol = s->pkl_loads;
    s->pkl_wire = w;
    s->pkl_loads = l;
    s->pkl_gen = pickle_gen;
    Py_XDECREF(ow);
    Py_XDECREF(ol);
  }
  return Py_NewRef(kind == 1 ? s->pkl_wire : s->pkl_loads);
}

static PyObject *meth_extra_read(int kind, PyObject *self) {
  if (kind == 4) {
    PyObject *g = PyObject_GetAttr(self, str_group), *x = NULL;
    if (g) {
      x = PyObject_GetAttr(g, str_index);
      Py_DECREF(g);
    }
    if (!x) PyErr_Clear();
    return x;
  }
  PyObject *pkl = PyObject_GetAttr(self, str_pkl), *x = NULL;
  if (pkl) {
    x = PyObject_GetAttr(pkl, kind == 1 ? str_wire : str_loads);
    Py_DECREF(pkl);
  }
  if (!x) PyErr_Clear();
  else if (kind == 2 && x != std_loads) {
    Py_DECREF(x);
    x = Py_NewRef(Py_None);
  }
  return x;
}

/* The index of parameter `kw` of m, else -1 (an error set only when a
 * comparison failed). */
static int meth_param(const pf_meth *m, PyObject *kw) {
  for (int i = 0; i < m->nmax; i++)
    if (m->name_at[i] == kw) return i; /* call sites' names are interned */
  for (int i = 0; i < m->nmax; i++) {
    int eq = PyObject_RichCompareBool(m->name_at[i], kw, Py_EQ);
    if (eq) return eq > 0 ? i : -1;
  }
  return -1;
}

static PyObject *meth_call(pf_meth *m, PyObject *self, PyObject *const *args, Py_ssize_t n,
                           PyObject *kwnames) {
  Py_ssize_t nk = kwnames ? PyTuple_Size(kwnames) : 0;
  if (n > m->nmax || nk > m->nmax) return meth_full(m, self, args, n, kwnames);
  if (PyList_Size(reap_list) != 0) { /* requests freed by the user: as Python's Send */
    PyObject *o = PyObject_CallNoArgs(reap);
    if (!o) return NULL;
    Py_DECREF(o);
  }
  PyObject *all[PF_MAXARGS], *a[PF_MAXARGS + 3];
  for (int i = 0; i < m->nmax; i++) all[i] = i < n ? args[i] : NULL;
  for (Py_ssize_t k = 0; k < nk; k++) { /* a keyword the Python method would refuse: it does */
    int i = meth_param(m, PyTuple_GetItem(kwnames, k));
    if (i < 0 || all[i]) {
      PyErr_Clear();
      return meth_full(m, self, args, n, kwnames);
    }
    all[i] = args[n + k];
  }
  for (int i = 0; i < m->nmax; i++) {
    if (!all[i]) {
      if (i < m->nmin) return meth_full(m, self, args, n, kwnames);
      all[i] = m->dflt_at[i - m->nmin];
    }
    if ((m->none_mask >> i & 1) && all[i] != Py_None)
      return meth_full(m, self, args, n, kwnames);
  }
  PyObject *state = *(PyObject **)((char *)self + fast_offset);
  if (!state || (m->extra && state == Py_None)) /* Python makes the state */
    return meth_full(m, self, args, n, kwnames);
  /* held: the calls below may run Python code (a property, another thread
   * while the GIL is released) that resets the field */
  Py_INCREF(state);
  int na = 1;
  a[0] = state;
  for (int i = 0; i < m->norder; i++)
    a[na++] = m->order[i] >= 0
                  ? all[m->order[i]]
                  : m->dflt_at[m->nmax - m->nmin - 1 - m->order[i]];
  PyObject *x = NULL, *x2 = NULL;
  if ((m->extra && !(a[na++] = x = meth_extra(m->extra == 3 ? 1 : m->extra, self, state))) ||
      (m->extra == 3 && !(a[na++] = x2 = meth_extra(2, self, state)))) {
    Py_DECREF(state);
    Py_XDECREF(x);
    return meth_full(m, self, args, n, kwnames);
  }
  PyObject *r = m->fn(NULL, a, na);
  Py_DECREF(state);
  Py_XDECREF(x);
  Py_XDECREF(x2);
  if (!r) return NULL;
  if (m->result == 2) {
    if (Py_TYPE(r) == (PyTypeObject *)op_type) {
      PyObject *req = request_of(r);
      Py_DECREF(r);
      return req;
    }
  } else if (m->result == 0 ? PyLong_CheckExact(r) && PyObject_IsTrue(r) == 0
                            : Py_TYPE(r) != (PyTypeObject *)more_type) {
    if (m->result == 1) return r;
    Py_DECREF(r);
    Py_RETURN_NONE;
  }
  PyObject *more = PyObject_GetAttr(self, m->more);
  PyObject *t = more ? PyTuple_New(m->nmax + 1) : NULL;
  PyObject *out = NULL;
  if (t) {
    PyTuple_SetItem(t, 0, r);
    r = NULL;
    for (int i = 0; i < m->nmax; i++) PyTuple_SetItem(t, 1 + i, Py_NewRef(all[i]));
    out = PyObject_Call(more, t, NULL);
  }
  Py_XDECREF(r);
  Py_XDECREF(more);
  Py_XDECREF(t);
  if (out && m->result == 0) /* the Python method returned None after its rest */
    Py_DECREF(out), out = Py_NewRef(Py_None);
  return out;
}

#define PF_NMETH 20
static pf_meth meths[PF_NMETH];
#define PF_TRAMP(i)                                                                        \
  static PyObject *meth_##i(PyObject *self, PyObject *const *args, Py_ssize_t n,          \
                            PyObject *kw) {                                               \
    return meth_call(&meths[i], self, args, n, kw);                                       \
  }
PF_TRAMP(0) PF_TRAMP(1) PF_TRAMP(2) PF_TRAMP(3) PF_TRAMP(4) PF_TRAMP(5) PF_TRAMP(6)
PF_TRAMP(7) PF_TRAMP(8) PF_TRAMP(9) PF_TRAMP(10) PF_TRAMP(11) PF_TRAMP(12) PF_TRAMP(13)
PF_TRAMP(14) PF_TRAMP(15) PF_TRAMP(16) PF_TRAMP(17) PF_TRAMP(18) PF_TRAMP(19)
typedef PyObject *(*pf_fastkw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
static const pf_fastkw tramps[PF_NMETH] = {meth_0, meth_1, meth_2, meth_3, meth_4, meth_5,
                                           meth_6, meth_7, meth_8, meth_9, meth_10, meth_11,
                                           meth_12, meth_13, meth_14, meth_15, meth_16, meth_17,
                                           meth_18, meth_19};

static const struct {
  const char *name;
  pf_fn fn;
} fast_fns[] = {{"send", pf_send},
                {"recv", pf_recv},
                {"barrier", pf_barrier},
                {"bcast", pf_bcast},
                {"allreduce", pf_allreduce},
                {"reduce_scatter", pf_reduce_scatter},
                {"alltoall", pf_alltoall},
                {"allgather", pf_allgather},
                {"rooted", pf_rooted},
                {"send_obj", pf_send_obj},
                {"recv_obj", pf_recv_obj},
                {"recv_st", pf_recv_st},
                {"sendrecv_st", pf_sendrecv_st},
                {"sendrecv_replace_st", pf_sendrecv_replace_st},
                {"sendrecv_obj", pf_sendrecv_obj},
                {"isend", pf_isend},
                {"irecv", pf_irecv},
                {NULL, NULL}};

/* setup(handle_type, fast_offset, reap_list, reap, std_loads, request_type,
 * status_type) */
static PyObject *pf_setup(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long off;
  if (n != 7 || !PyType_Check(args[0]) || !PyType_Check(args[6]) ||
      !small_int(args[1], (long)sizeof(PyObject), 4096, &off) || !PyList_Check(args[2]) ||
      !PyCallable_Check(args[3]) || !PyCallable_Check(args[4]) || !PyType_Check(args[5]) ||
      !PyType_IsSubtype((PyTypeObject *)args[5], (PyTypeObject *)args[0])) {
    PyErr_SetString(PyExc_TypeError, "setup(): bad arguments");
    return NULL;
  }
  if (handle_type) {
    PyErr_SetString(PyExc_ValueError, "setup(): already done");
    return NULL;
  }
  if ((!str_pkl && !(str_pkl = PyUnicode_InternFromString("_pkl"))) ||
      (!str_wire && !(str_wire = PyUnicode_InternFromString("_wire"))) ||
      (!str_loads && !(str_loads = PyUnicode_InternFromString("_loads"))) ||
      (!str_group && !(str_group = PyUnicode_InternFromString("_group"))) ||
      (!str_index && !(str_index = PyUnicode_InternFromString("_index"))) ||
      (!str_op && !(str_op = PyUnicode_InternFromString("_op"))) ||
      (!str_predef && !(str_predef = PyUnicode_InternFromString("_predef"))) ||
      (!str_start && !(str_start = PyUnicode_InternFromString("_start"))) ||
      (!no_args && !(no_args = PyTuple_New(0))))
    return NULL;
  request_type = (PyTypeObject *)Py_NewRef(args[5]);
  if (slot_find(&slot_op, str_op) || slot_find(&slot_predef, str_predef) ||
      slot_find(&slot_start, str_start)) {
    Py_CLEAR(request_type);
    return NULL;
  }
  status_type = (PyTypeObject *)Py_NewRef(args[6]);
  handle_type = (PyTypeObject *)Py_NewRef(args[0]);
  fast_offset = off;
  reap_list = Py_NewRef(args[2]);
  reap = Py_NewRef(args[3]);
  std_loads = Py_NewRef(args[4]);
  Py_RETURN_NONE;
}

/* a malloc'd copy of str o: 1; else 0 with an exception set */
static int utf8_dup(PyObject *o, char **out) {
  *out = NULL;
  if (!PyUnicode_Check(o)) {
    PyErr_SetString(PyExc_TypeError, "method(): a name or doc is not a str");
    return 0;
  }
  const char *u = PyUnicode_AsUTF8AndSize(o, NULL);
  if (!u) return 0;
  if (!(*out = strdup(u))) PyErr_NoMemory();
  return *out != NULL;
}

/* method(cls, slot, fast, nmin, nmax, none_mask, defaults, order, more, full,
 * name, doc, extra, result, names) */
static PyObject *pf_method(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long slot, nmin, nmax, none_mask, extra, res;
  Py_ssize_t nd = n == 15 && PyTuple_Check(args[6]) ? PyTuple_Size(args[6]) : -1;
  Py_ssize_t no = n == 15 && PyTuple_Check(args[7]) ? PyTuple_Size(args[7]) : -1;
  if (n != 15 || !handle_type || !PyType_Check(args[0]) ||
      !PyType_IsSubtype((PyTypeObject *)args[0], handle_type) ||
      !small_int(args[1], 0, PF_NMETH - 1, &slot) || !PyUnicode_Check(args[2]) ||
      !small_int(args[3], 0, PF_MAXARGS, &nmin) || !small_int(args[4], nmin, PF_MAXARGS, &nmax) ||
      nd > 2 * PF_MAXARGS ||
      !small_int(args[5], 0, (1L << nmax) - 1, &none_mask) || nd < nmax - nmin || no < 0 ||
      no > PF_MAXARGS || !PyUnicode_Check(args[8]) || !PyUnicode_Check(args[9]) ||
      !small_int(args[12], 0, 4, &extra) || !small_int(args[13], 0, 2, &res) ||
      !PyTuple_Check(args[14]) || PyTuple_Size(args[14]) != nmax) {
    PyErr_SetString(PyExc_TypeError, "method(): bad arguments");
    return NULL;
  }
  pf_meth *m = &meths[slot];
  if (m->def.ml_name) {
    PyErr_SetString(PyExc_ValueError, "method(): slot taken");
    return NULL;
  }
  for (Py_ssize_t i = 0; i < no; i++) {
    long o;
    if (!small_int(PyTuple_GetItem(args[7], i), -(nd - (nmax - nmin)), nmax - 1, &o)) {
      PyErr_SetString(PyExc_ValueError, "method(): order names no argument or constant");
      return NULL;
    }
    m->order[i] = (signed char)o;
  }
  const char *fname = PyUnicode_AsUTF8AndSize(args[2], NULL);
  pf_fn fn = NULL;
  for (int i = 0; fname && fast_fns[i].name; i++)
    if (!strcmp(fast_fns[i].name, fname)) fn = fast_fns[i].fn;
  if (!fn) {
    PyErr_SetString(PyExc_ValueError, "method(): no such fast call");
    return NULL;
  }
  char *name, *doc = NULL; /* doc None: none */
  if (!utf8_dup(args[10], &name)) return NULL;
  if (args[11] != Py_None && !utf8_dup(args[11], &doc)) {
    free(name);
    return NULL;
  }
  m->fn = fn;
  m->nmin = (int)nmin;
  m->nmax = (int)nmax;
  m->none_mask = (int)none_mask;
  m->norder = (int)no;
  m->extra = (int)extra;
  m->result = (int)res;
  m->dflt = Py_NewRef(args[6]);
  m->names = Py_NewRef(args[14]);
  for (Py_ssize_t i = 0; i < nd; i++) m->dflt_at[i] = PyTuple_GetItem(m->dflt, i);
  for (long i = 0; i < nmax; i++) m->name_at[i] = PyTuple_GetItem(m->names, i);
  m->more = Py_NewRef(args[8]);
  m->full = Py_NewRef(args[9]);
  m->def.ml_name = name;
  m->def.ml_meth = (PyCFunction)(void (*)(void))tramps[slot];
  m->def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
  m->def.ml_doc = doc;
  PyObject *d = PyDescr_NewMethod((PyTypeObject *)args[0], &m->def);
  if (!d) { /* the slot stays free (its references are kept: a few bytes) */
    m->def.ml_name = NULL;
    free(name);
    free(doc);
  }
  return d;
}

static PyMethodDef pf_methods[] = {
    {"method", (PyCFunction)(void (*)(void))pf_method, METH_FASTCALL, NULL},
    {"setup", (PyCFunction)(void (*)(void))pf_setup, METH_FASTCALL, NULL},
    {"pickle_changed", (PyCFunction)(void (*)(void))pf_pickle_changed, METH_FASTCALL, NULL},
    {"remember_allreduce", (PyCFunction)(void (*)(void))pf_remember_allreduce, METH_FASTCALL,
     NULL},
    {"allreduce", (PyCFunction)(void (*)(void))pf_allreduce, METH_FASTCALL, NULL},
    {"remember_alltoall", (PyCFunction)(void (*)(void))pf_remember_alltoall, METH_FASTCALL,
     NULL},
    {"alltoall", (PyCFunction)(void (*)(void))pf_alltoall, METH_FASTCALL, NULL},
    {"remember_allgather", (PyCFunction)(void (*)(void))pf_remember_allgather, METH_FASTCALL,
     NULL},
    {"allgather", (PyCFunction)(void (*)(void))pf_allgather, METH_FASTCALL, NULL},
    {"remember_reduce_scatter", (PyCFunction)(void (*)(void))pf_remember_reduce_scatter,
     METH_FASTCALL, NULL},
    {"reduce_scatter", (PyCFunction)(void (*)(void))pf_reduce_scatter, METH_FASTCALL, NULL},
    {"remember_bcast", (PyCFunction)(void (*)(void))pf_remember_bcast, METH_FASTCALL, NULL},
    {"remember_rooted", (PyCFunction)(void (*)(void))pf_remember_rooted, METH_FASTCALL,
     NULL},
    {"rooted", (PyCFunction)(void (*)(void))pf_rooted, METH_FASTCALL, NULL},
    {"bcast", (PyCFunction)(void (*)(void))pf_bcast, METH_FASTCALL, NULL},
    {"remember_barrier", (PyCFunction)(void (*)(void))pf_remember_barrier, METH_FASTCALL,
     NULL},
    {"barrier", (PyCFunction)(void (*)(void))pf_barrier, METH_FASTCALL, NULL},
    {"new", (PyCFunction)(void (*)(void))pf_new, METH_FASTCALL, NULL},
    {"remember", (PyCFunction)(void (*)(void))pf_remember, METH_FASTCALL, NULL},
    {"send", (PyCFunction)(void (*)(void))pf_send, METH_FASTCALL, NULL},
    {"recv", (PyCFunction)(void (*)(void))pf_recv, METH_FASTCALL, NULL},
    {"recv_status", (PyCFunction)(void (*)(void))pf_recv_status, METH_FASTCALL, NULL},
    {"hits", (PyCFunction)(void (*)(void))pf_hits, METH_FASTCALL, NULL},
    {"end_inline", (PyCFunction)(void (*)(void))pf_end_inline, METH_FASTCALL, NULL},
    {"waitall_setup", (PyCFunction)(void (*)(void))pf_waitall_setup, METH_FASTCALL, NULL},
    {"Waitall", (PyCFunction)(void (*)(void))pf_waitall, METH_FASTCALL | METH_KEYWORDS,
     "Waitall($module, cls, requests, statuses=None)\n--\n\n"
     "Wait for all requests; fills ``statuses`` (a list) when given."},
    {"sendrecv", (PyCFunction)(void (*)(void))pf_sendrecv, METH_FASTCALL, NULL},
    {"sendrecv_replace", (PyCFunction)(void (*)(void))pf_sendrecv_replace, METH_FASTCALL,
     NULL},
    {"remember_packed", (PyCFunction)(void (*)(void))pf_remember_packed, METH_FASTCALL,
     NULL},
    {"isend", (PyCFunction)(void (*)(void))pf_isend, METH_FASTCALL, NULL},
    {"configure", (PyCFunction)(void (*)(void))pf_configure, METH_FASTCALL, NULL},
    {"irecv", (PyCFunction)(void (*)(void))pf_irecv, METH_FASTCALL, NULL},
    {"send_bytes", (PyCFunction)(void (*)(void))pf_send_bytes, METH_FASTCALL, NULL},
    {"send_obj", (PyCFunction)(void (*)(void))pf_send_obj, METH_FASTCALL, NULL},
    {"recv_bytes", (PyCFunction)(void (*)(void))pf_recv_bytes, METH_FASTCALL, NULL},
    {"recv_obj", (PyCFunction)(void (*)(void))pf_recv_obj, METH_FASTCALL, NULL},
    {"pair_obj", (PyCFunction)(void (*)(void))pf_pair_obj, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef pf_module = {PyModuleDef_HEAD_INIT, NULL, NULL, -1, pf_methods,
                                       NULL, NULL, NULL, NULL};

/* Called through cffi (GIL released): create module `name` in sys.modules. */
int erdma_pyfast_init(const char *name) {
  PyGILState_STATE g = PyGILState_Ensure();
  int rv = -1;
  PyObject *mods = PyImport_GetModuleDict(); /* borrowed */
  if (PyMapping_HasKeyString(mods, name)) {
    rv = 0;
  } else {
    pf_module.m_name = strdup(name);
    PyObject *m = pf_module.m_name ? PyModule_Create(&pf_module) : NULL;
    if (m && !op_type) op_type = PyType_FromSpec(&op_spec);
    if (m && (!op_type || PyModule_AddObjectRef(m, "Op", op_type) != 0)) Py_CLEAR(m);
    if (m && !more_type) more_type = PyType_FromSpec(&more_spec);
    if (m && (!more_type || PyModule_AddObjectRef(m, "More", more_type) != 0)) Py_CLEAR(m);
    if (m && !oob_cb) { /* send_obj's buffer_callback; without it send_obj misses */
      oob_stop = PyErr_NewException("erdmampi._erdma_fast.OobStop", NULL, NULL);
      oob_type = oob_stop ? PyType_FromSpec(&oobcb_spec) : NULL;
      oob_kw = oob_type ? PyDict_New() : NULL;
      PyObject *cb = NULL;
      if (oob_kw) {
        allocfunc a = (allocfunc)PyType_GetSlot((PyTypeObject *)oob_type, Py_tp_alloc);
        cb = a((PyTypeObject *)oob_type, 0);
      }
      if (cb && PyDict_SetItemString(oob_kw, "buffer_callback", cb) == 0) oob_cb = cb;
      else Py_XDECREF(cb);
      PyErr_Clear();
    }
    if (m) {
      rv = PyDict_SetItemString(mods, name, m) == 0 ? 0 : -1;
      Py_DECREF(m);
    }
  }
  if (rv) PyErr_Clear();
  PyGILState_Release(g);
  return rv;
}

#else

int erdma_pyfast_init(const char *name) { (void)name; return -1; }

#endif
