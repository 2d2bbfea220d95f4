/* erdma_pyfast.c - CPython entry points for the blocking point-to-point fast
 * path: Comm.Send / Comm.Recv of a buffer the communicator remembers.
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
 *   new(engine_addr, owner, ctx, ranks, tag_ub, slice) -> state (a capsule)
 *   remember(state, recv, spec, arr, dt, flags) -> bool
 *   send(state, buf, dest, tag) / recv(state, buf, source, tag) ->
 *     0 done; 1 miss (nothing done); a negative ERDMA error the operation
 *     completed with; or (rc, left): erdma_send/erdma_recv's own error, with
 *     left the address of the request still pending after `slice` seconds
 *     (ERDMA_ERR_TIMEOUT) or 0.
 * erdma_pyfast_invalidate() retires every state (engine shutdown): they miss.
 *
 * Limited API 3.11 (the module is abi3); older Pythons get no module and
 * keep the normal path. */
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030B0000
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "erdma.h"

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

typedef struct {
  PyObject *spec, *arr, *dt; /* dt NULL: spec is the array itself */
  Py_buffer view;            /* an export of arr: its memory stays put */
  int have, busy;
  int need;                  /* flag bits arr must still have */
} pf_entry;

typedef struct {
  erdma_engine *e;
  PyObject *owner; /* the engine's Python wrapper: keeps the engine alive */
  unsigned epoch;
  uint32_t ctx;
  int size;
  long tag_ub;
  double slice;
  pf_entry ent[2]; /* 0: send, 1: recv */
  int ranks[];
} pf_state;

static const char CAPSULE[] = "erdmampi._erdma_fast.state";

static void entry_clear(pf_entry *x) {
  if (!x->have) return;
  x->have = 0;
  PyBuffer_Release(&x->view);
  Py_CLEAR(x->spec);
  Py_CLEAR(x->arr);
  Py_CLEAR(x->dt);
}

static void state_free(PyObject *cap) {
  pf_state *s = PyCapsule_GetPointer(cap, CAPSULE);
  if (!s) return;
  entry_clear(&s->ent[0]);
  entry_clear(&s->ent[1]);
  Py_XDECREF(s->owner);
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

/* new(engine_addr, owner, ctx, ranks, tag_ub, slice) */
static PyObject *pf_new(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 6) {
    PyErr_SetString(PyExc_TypeError, "new() takes 6 arguments");
    return NULL;
  }
  void *e = PyLong_AsVoidPtr(args[0]);
  unsigned long ctx = PyLong_AsUnsignedLong(args[2]);
  long tag_ub = PyLong_AsLong(args[4]);
  double slice = PyFloat_AsDouble(args[5]);
  if (PyErr_Occurred()) return NULL;
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
  s->epoch = pyfast_epoch;
  s->ctx = (uint32_t)ctx;
  s->size = (int)size;
  s->tag_ub = tag_ub;
  s->slice = slice;
  PyObject *cap = PyCapsule_New(s, CAPSULE, state_free);
  if (!cap) {
    Py_DECREF(s->owner);
    free(s);
  }
  return cap;
}

/* remember(state, recv, spec, arr, dt, flags): arr (a numpy.ndarray that
 * Python found plain, whole and C-contiguous, writeable for a receive) is
 * what `spec` means; flags is arr.flags.num as Python saw it. */
static PyObject *pf_remember(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  if (n != 6) {
    PyErr_SetString(PyExc_TypeError, "remember() takes 6 arguments");
    return NULL;
  }
  pf_state *s = state_of(args[0]);
  int recv = PyObject_IsTrue(args[1]);
  long flags = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return NULL;
  PyObject *spec = args[2], *arr = args[3], *dt = args[4] == Py_None ? NULL : args[4];
  if (!s || recv < 0) Py_RETURN_FALSE;
  pf_entry *x = &s->ent[recv];
  int need = NP_C_CONTIGUOUS | (recv ? NP_WRITEABLE : 0);
  /* the layout above is numpy's (else never read it) */
  if (((np_head *)arr)->flags != (int)flags || (flags & need) != need) Py_RETURN_FALSE;
  if (x->busy) Py_RETURN_FALSE; /* another thread is sending from it now */
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
  x->need = need;
  x->have = 1;
  Py_RETURN_TRUE;
}

/* The remembered entry if `buf` is (still) its spec, else NULL. */
static pf_entry *entry_for(pf_state *s, int recv, PyObject *buf) {
  pf_entry *x = &s->ent[recv];
  if (!x->have || buf != x->spec || x->busy) return NULL;
  if (x->dt) {
    PyObject *a, *d;
    if (PyList_CheckExact(buf)) {
      if (PyList_Size(buf) != 2) return NULL;
      a = PyList_GetItem(buf, 0);
      d = PyList_GetItem(buf, 1);
    } else if (PyTuple_CheckExact(buf)) {
      if (PyTuple_Size(buf) != 2) return NULL;
      a = PyTuple_GetItem(buf, 0);
      d = PyTuple_GetItem(buf, 1);
    } else {
      return NULL;
    }
    if (a != x->arr || d != x->dt) return NULL;
  }
  if ((((np_head *)x->arr)->flags & x->need) != x->need) return NULL;
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

static PyObject *pf_send(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long dest, tag;
  pf_state *s;
  pf_entry *x;
  if (n != 4 || !(s = state_of(args[0])) || !(x = entry_for(s, 0, args[1])) ||
      !small_int(args[2], 0, s->size - 1, &dest) || !small_int(args[3], 0, s->tag_ub, &tag))
    return PyLong_FromLong(1);
  erdma_blocking out;
  x->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_send(s->e, x->view.buf, (uint64_t)x->view.len, s->ranks[dest], (int)tag,
                      s->ctx, 0, s->slice, &out);
  PyEval_RestoreThread(ts);
  x->busy--;
  return result(rc, &out);
}

static PyObject *pf_recv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
  long src, tag;
  pf_state *s;
  pf_entry *x;
  if (n != 4 || !(s = state_of(args[0])) || !(x = entry_for(s, 1, args[1])) ||
      !small_int(args[2], ERDMA_ANY_SOURCE, s->size - 1, &src) || src == -1 ||
      !small_int(args[3], ERDMA_ANY_TAG, s->tag_ub, &tag))
    return PyLong_FromLong(1);
  /* MPI's ANY_SOURCE / ANY_TAG are the engine's (erdmampi.comm); -1 is PROC_NULL */
  erdma_blocking out;
  x->busy++;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = erdma_recv(s->e, x->view.buf, (uint64_t)x->view.len,
                      src == ERDMA_ANY_SOURCE ? ERDMA_ANY_SOURCE : s->ranks[src], (int)tag,
                      s->ctx, s->slice, &out);
  PyEval_RestoreThread(ts);
  x->busy--;
  return result(rc, &out);
}

static PyMethodDef pf_methods[] = {
    {"new", (PyCFunction)(void (*)(void))pf_new, METH_FASTCALL, NULL},
    {"remember", (PyCFunction)(void (*)(void))pf_remember, METH_FASTCALL, NULL},
    {"send", (PyCFunction)(void (*)(void))pf_send, METH_FASTCALL, NULL},
    {"recv", (PyCFunction)(void (*)(void))pf_recv, METH_FASTCALL, NULL},
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
