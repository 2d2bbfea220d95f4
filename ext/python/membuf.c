/* erdmampi._membuf: the `MPI.buffer` type (mpi4py's buffer object).
 *
 * A byte view (format "B", itemsize 1) over memory that another object
 * exports, that this module allocates, or that lies at a raw address.
 * It must export the buffer protocol, which a pure-Python class cannot do
 * on Python < 3.12, hence C.  Semantics and error types follow mpi4py's
 * asbuffer.pxi: the held Py_buffer keeps the exporter's view (so `itemsize`
 * reports the exporter's item size) while the exported view is plain bytes.
 *
 * The module also holds `handle`, the base type of the MPI handle classes
 * (the handle kept in C memory, see below).
 *
 * Limited API (3.11: the first with Py_buffer and the buffer slots), so one
 * _membuf.abi3.so serves Python 3.11 and every later version.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int device;     /* memory of a device exporter: no CPU access (as mpi4py) */
} MembufObject;

/* the heap type, made at module init (the limited API has no static types) */
static PyTypeObject *Membuf_Type;
/* its tp_name, as mpi4py's "mpi4py.MPI.buffer"; the type is final, so this
   is also Py_TYPE(self)'s name for every instance */
#define MEMBUF_NAME "erdmampi.MPI.buffer"

static void view_empty(Py_buffer *view)
{
    /* cannot fail: no exporter and read-only not requested */
    (void)PyBuffer_FillInfo(view, NULL, NULL, 0, 0, PyBUF_SIMPLE);
}

static MembufObject *membuf_alloc(void)
{
    MembufObject *self = PyObject_New(MembufObject, Membuf_Type);
    if (self != NULL)
        self->device = 0;
    if (self != NULL)
        view_empty(&self->view);
    return self;
}

static MembufObject *membuf_over(PyObject *owner, void *base, Py_ssize_t size, int readonly);

/* DLPack and CUDA-array-interface exporters (host memory), through
 * erdmampi.buffers.export_for_membuf: NULL with the original error kept when
 * `obj` has neither. */
static MembufObject *membuf_from_exporter(PyObject *obj, int writable)
{
    PyObject *etype, *evalue, *etb, *mod, *res;
    PyObject *owner;
    Py_ssize_t addr, size;
    int readonly, device;
    MembufObject *self;
    PyErr_Fetch(&etype, &evalue, &etb);
    mod = PyImport_ImportModule("erdmampi.buffers");
    res = mod ? PyObject_CallMethod(mod, "export_for_membuf", "Oi", obj, writable) : NULL;
    Py_XDECREF(mod);
    if (res == NULL) {
        if (PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
            PyErr_Restore(etype, evalue, etb);   /* no exporter at all */
            return NULL;
        }
        Py_XDECREF(etype); Py_XDECREF(evalue); Py_XDECREF(etb);
        return NULL;
    }
    Py_XDECREF(etype); Py_XDECREF(evalue); Py_XDECREF(etb);
    if (!PyArg_ParseTuple(res, "Onnpp", &owner, &addr, &size, &readonly, &device)) {
        Py_DECREF(res);
        return NULL;
    }
    self = membuf_over(owner, (void *)addr, size, readonly);
    if (self != NULL)
        self->device = device;
    Py_DECREF(res);
    return self;
}

/* A new buffer over `obj`'s exported memory (mpi4py's getbuffer). */
static MembufObject *membuf_from(PyObject *obj, int flags)
{
    MembufObject *self = PyObject_New(MembufObject, Membuf_Type);
    if (self == NULL)
        return NULL;
    self->device = 0;
    if (PyObject_GetBuffer(obj, &self->view, flags) < 0) {
        view_empty(&self->view);
        Py_DECREF(self);
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            return membuf_from_exporter(obj, (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE);
        return NULL;
    }
    return self;
}

/* A new buffer over [base, base+size) kept alive by `owner` (may be NULL). */
static MembufObject *membuf_over(PyObject *owner, void *base, Py_ssize_t size, int readonly)
{
    MembufObject *self;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "expecting non-negative buffer length");
        return NULL;
    }
    self = membuf_alloc();
    if (self == NULL)
        return NULL;
    if (PyBuffer_FillInfo(&self->view, owner, base, size, readonly, PyBUF_SIMPLE) < 0) {
        view_empty(&self->view);
        Py_DECREF(self);
        return NULL;
    }
    return self;
}

static void membuf_release_view(MembufObject *self)
{
    /* views filled with an owner hold a reference that Release drops */
    PyBuffer_Release(&self->view);
    view_empty(&self->view);
}

static void Membuf_dealloc(MembufObject *self)
{
    /* instances of a heap type own a reference to it (PyObject_New took it) */
    PyTypeObject *tp = Py_TYPE((PyObject *)self);
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
    Py_DECREF((PyObject *)tp);
}

/* buffer(obj=None): extra positional arguments are ignored, as in mpi4py */
static PyObject *Membuf_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)type;
    if (kwds != NULL && PyDict_Size(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "buffer() takes no keyword arguments");
        return NULL;
    }
    if (PyTuple_Size(args) > 0)
        return (PyObject *)membuf_from(PyTuple_GetItem(args, 0), PyBUF_SIMPLE);
    return (PyObject *)membuf_alloc();
}

/* MPI_Aint argument: integers (or __index__ objects) only */
static int as_aint(PyObject *ob, Py_ssize_t *out)
{
    if (!PyLong_Check(ob) && !PyIndex_Check(ob)) {
        PyErr_SetString(PyExc_TypeError, "an integer is required");
        return -1;
    }
    *out = PyNumber_AsSsize_t(ob, PyExc_OverflowError);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

static PyObject *Membuf_allocate(PyObject *unused, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"nbytes", "clear", NULL};
    PyObject *nbytes_ob, *clear_ob = Py_False, *store;
    Py_ssize_t size;
    int clear;
    MembufObject *buf;
    (void)unused;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:allocate", kwlist, &nbytes_ob, &clear_ob))
        return NULL;
    if (as_aint(nbytes_ob, &size) < 0 || (clear = PyObject_IsTrue(clear_ob)) < 0)
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "expecting non-negative size");
        return NULL;
    }
    /* a bytearray owns the memory (mpi4py's obj is a private type; any
       exporter of the same bytes serves) */
    store = PyByteArray_FromStringAndSize(NULL, size);
    if (store == NULL)
        return NULL;
    if (clear && size > 0)
        memset(PyByteArray_AsString(store), 0, (size_t)size);
    buf = membuf_from(store, PyBUF_SIMPLE | PyBUF_WRITABLE);
    Py_DECREF(store);
    return (PyObject *)buf;
}

static PyObject *Membuf_frombuffer(PyObject *unused, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"obj", "readonly", NULL};
    PyObject *obj, *ro_ob = Py_False;
    int readonly;
    MembufObject *buf;
    (void)unused;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:frombuffer", kwlist, &obj, &ro_ob))
        return NULL;
    readonly = PyObject_IsTrue(ro_ob);
    if (readonly < 0)
        return NULL;
    buf = membuf_from(obj, readonly ? PyBUF_SIMPLE : (PyBUF_SIMPLE | PyBUF_WRITABLE));
    if (buf != NULL)
        buf->view.readonly = readonly;
    return (PyObject *)buf;
}

static PyObject *Membuf_fromaddress(PyObject *unused, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"address", "nbytes", "readonly", NULL};
    PyObject *addr_ob, *nbytes_ob, *ro_ob = Py_False;
    Py_ssize_t size;
    void *addr;
    int readonly;
    (void)unused;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O:fromaddress", kwlist,
                                     &addr_ob, &nbytes_ob, &ro_ob))
        return NULL;
    if (as_aint(nbytes_ob, &size) < 0)
        return NULL;
    readonly = PyObject_IsTrue(ro_ob);
    if (readonly < 0)
        return NULL;
    addr = PyLong_AsVoidPtr(addr_ob);
    if (addr == NULL && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "expecting non-negative buffer length");
        return NULL;
    }
    if (size > 0 && addr == NULL) {
        PyErr_SetString(PyExc_ValueError, "expecting non-NULL address");
        return NULL;
    }
    return (PyObject *)membuf_over(NULL, addr, size, readonly);
}

/* ---- properties ---------------------------------------------------------- */

static PyObject *Membuf_get_address(MembufObject *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(self->view.buf);
}

static PyObject *Membuf_get_obj(MembufObject *self, void *c)
{
    (void)c;
    if (self->view.obj == NULL)
        Py_RETURN_NONE;
    Py_INCREF(self->view.obj);
    return self->view.obj;
}

static PyObject *Membuf_get_nbytes(MembufObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(self->view.len);
}

static PyObject *Membuf_get_readonly(MembufObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->view.readonly);
}

static PyObject *Membuf_get_format(MembufObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->view.format ? self->view.format : "B");
}

static PyObject *Membuf_get_itemsize(MembufObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(self->view.itemsize);
}

/* ---- methods ------------------------------------------------------------- */

static int no_cpu(MembufObject *self)
{
    if (!self->device)
        return 0;
    PyErr_SetString(PyExc_BufferError, "buffer: not a CPU buffer");
    return -1;
}

static PyObject *Membuf_cast(MembufObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"format", "shape", NULL};
    PyObject *format, *shape = Py_Ellipsis, *mv, *res;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:cast", kwlist, &format, &shape))
        return NULL;
    mv = PyMemoryView_FromObject((PyObject *)self);
    if (mv == NULL)
        return NULL;
    if (shape == Py_Ellipsis)
        res = PyObject_CallMethod(mv, "cast", "O", format);
    else
        res = PyObject_CallMethod(mv, "cast", "OO", format, shape);
    Py_DECREF(mv);
    return res;
}

static PyObject *Membuf_tobytes(MembufObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"order", NULL};
    PyObject *order = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:tobytes", kwlist, &order))
        return NULL;
    if (no_cpu(self) < 0)
        return NULL;
    return PyBytes_FromStringAndSize((const char *)self->view.buf, self->view.len);
}

static PyObject *Membuf_toreadonly(MembufObject *self, PyObject *unused)
{
    /* a view of the original exporter, as mpi4py does (for a slice this
       covers the whole parent buffer) */
    PyObject *obj = self->view.obj ? self->view.obj : (PyObject *)self;
    MembufObject *buf;
    (void)unused;
    buf = membuf_from(obj, PyBUF_SIMPLE);
    if (buf != NULL)
        buf->view.readonly = 1;
    return (PyObject *)buf;
}

static PyObject *Membuf_release(MembufObject *self, PyObject *unused)
{
    (void)unused;
    membuf_release_view(self);
    Py_RETURN_NONE;
}

/* ---- buffer protocol ----------------------------------------------------- */

static int Membuf_getbuffer(MembufObject *self, Py_buffer *view, int flags)
{
    if (no_cpu(self) < 0)
        return -1;
    return PyBuffer_FillInfo(view, (PyObject *)self, self->view.buf, self->view.len,
                             self->view.readonly, flags);
}

/* ---- sequence interface -------------------------------------------------- */

static Py_ssize_t Membuf_length(MembufObject *self)
{
    return self->view.len;
}

static int byte_index(MembufObject *self, PyObject *item, Py_ssize_t *out)
{
    Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0)
        i += self->view.len;
    if (i < 0 || i >= self->view.len) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return -1;
    }
    *out = i;
    return 0;
}

static int byte_slice(MembufObject *self, PyObject *item, Py_ssize_t *start, Py_ssize_t *len)
{
    Py_ssize_t stop, step;
    if (PySlice_Unpack(item, start, &stop, &step) < 0)
        return -1;
    *len = PySlice_AdjustIndices(self->view.len, start, &stop, step);
    if (step != 1) {
        PyErr_SetString(PyExc_IndexError, "slice with step not supported");
        return -1;
    }
    return 0;
}

/* C `unsigned char` conversion as Cython does it: ints, or objects with
   __int__ (floats truncate), range-checked */
static int as_uchar(PyObject *value, unsigned char *out)
{
    PyObject *num;
    unaryfunc nb_int;
    long v;
    int overflow;
    if (PyLong_Check(value)) {
        Py_INCREF(value);
        num = value;
    } else if ((nb_int = (unaryfunc)PyType_GetSlot(Py_TYPE(value), Py_nb_int)) != NULL) {
        num = nb_int(value);
        if (num == NULL)
            return -1;
    } else {
        PyErr_SetString(PyExc_TypeError, "an integer is required");
        return -1;
    }
    v = PyLong_AsLongAndOverflow(num, &overflow);
    Py_DECREF(num);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        v = overflow < 0 ? -1 : 256;  /* out of range: reported below */
    if (v < 0) {
        PyErr_SetString(PyExc_OverflowError, "can't convert negative value to unsigned char");
        return -1;
    }
    if (v > 255) {
        PyErr_SetString(PyExc_OverflowError, "value too large to convert to unsigned char");
        return -1;
    }
    *out = (unsigned char)v;
    return 0;
}

static PyObject *Membuf_subscript(MembufObject *self, PyObject *item)
{
    Py_ssize_t start, len;
    unsigned char *base = (unsigned char *)self->view.buf;
    if (PyIndex_Check(item)) {
        if (no_cpu(self) < 0 || byte_index(self, item, &start) < 0)
            return NULL;
        return PyLong_FromLong(base[start]);
    }
    if (PySlice_Check(item)) {
        if (byte_slice(self, item, &start, &len) < 0)
            return NULL;
        return (PyObject *)membuf_over((PyObject *)self, base + start, len,
                                       self->view.readonly);
    }
    PyErr_SetString(PyExc_TypeError, "index must be integer or slice");
    return NULL;
}

static int Membuf_ass_subscript(MembufObject *self, PyObject *item, PyObject *value)
{
    Py_ssize_t start, len;
    unsigned char *base = (unsigned char *)self->view.buf;
    unsigned char byte;
    Py_buffer src;
    if (value == NULL) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "Subscript deletion not supported by " MEMBUF_NAME);
        return -1;
    }
    if (no_cpu(self) < 0)
        return -1;
    if (self->view.readonly) {
        PyErr_SetString(PyExc_TypeError, "buffer is read-only");
        return -1;
    }
    if (PyIndex_Check(item)) {
        if (byte_index(self, item, &start) < 0 || as_uchar(value, &byte) < 0)
            return -1;
        base[start] = byte;
        return 0;
    }
    if (PySlice_Check(item)) {
        if (byte_slice(self, item, &start, &len) < 0)
            return -1;
        if (PyIndex_Check(value)) {
            if (as_uchar(value, &byte) < 0)
                return -1;
            if (len > 0)
                memset(base + start, byte, (size_t)len);
            return 0;
        }
        if (PyObject_GetBuffer(value, &src, PyBUF_ANY_CONTIGUOUS) < 0)
            return -1;
        if (src.len != len) {
            PyBuffer_Release(&src);
            PyErr_SetString(PyExc_ValueError, "slice length does not match buffer");
            return -1;
        }
        if (len > 0)
            memmove(base + start, src.buf, (size_t)len);
        PyBuffer_Release(&src);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "index must be integer or slice");
    return -1;
}

/* sq_item makes the buffer iterable, as Cython's __getitem__ does */
static PyObject *Membuf_item(MembufObject *self, Py_ssize_t i)
{
    PyObject *index = PyLong_FromSsize_t(i), *res;
    if (index == NULL)
        return NULL;
    res = Membuf_subscript(self, index);
    Py_DECREF(index);
    return res;
}

/* ---- type ---------------------------------------------------------------- */

/* docstrings open with the signature line, as mpi4py's (Cython
   embedsignature) do: help() and doc tools read the summary after it */
static PyMethodDef Membuf_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))Membuf_allocate,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "allocate(nbytes: int, clear: bool = False) -> buffer\n\nBuffer allocation."},
    {"frombuffer", (PyCFunction)(void (*)(void))Membuf_frombuffer,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "frombuffer(obj: Buffer, readonly: bool = False) -> buffer\n\n"
     "Buffer from buffer-like object."},
    {"fromaddress", (PyCFunction)(void (*)(void))Membuf_fromaddress,
     METH_VARARGS | METH_KEYWORDS | METH_STATIC,
     "fromaddress(address: int, nbytes: int, readonly: bool = False) -> buffer\n\n"
     "Buffer from address and size in bytes."},
    {"cast", (PyCFunction)(void (*)(void))Membuf_cast, METH_VARARGS | METH_KEYWORDS,
     "cast(self, format: str, shape: list[int] | tuple[int, ...] = ...) -> memoryview\n\n"
     "Cast to a `memoryview` with new format or shape."},
    {"tobytes", (PyCFunction)(void (*)(void))Membuf_tobytes, METH_VARARGS | METH_KEYWORDS,
     "tobytes(self, order: str | None = None) -> bytes\n\n"
     "Return the data in the buffer as a byte string."},
    {"toreadonly", (PyCFunction)Membuf_toreadonly, METH_NOARGS,
     "toreadonly(self) -> buffer\n\nReturn a readonly version of the buffer object."},
    {"release", (PyCFunction)Membuf_release, METH_NOARGS,
     "release(self) -> None\n\nRelease the underlying buffer exposed by the buffer object."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Membuf_getset[] = {
    {"address", (getter)Membuf_get_address, NULL, "Buffer address.", NULL},
    {"obj", (getter)Membuf_get_obj, NULL, "Object exposing buffer.", NULL},
    {"nbytes", (getter)Membuf_get_nbytes, NULL, "Buffer size (in bytes).", NULL},
    {"readonly", (getter)Membuf_get_readonly, NULL, "Buffer is read-only.", NULL},
    {"format", (getter)Membuf_get_format, NULL, "Format of each element.", NULL},
    {"itemsize", (getter)Membuf_get_itemsize, NULL, "Size (in bytes) of each element.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* No Py_bf_releasebuffer: exported views hold a reference to the buffer
   (view->obj), which PyBuffer_Release drops; nothing else to undo. */
static PyType_Slot Membuf_slots[] = {
    {Py_tp_dealloc, (void *)Membuf_dealloc},
    {Py_tp_new, (void *)Membuf_new},
    {Py_tp_methods, Membuf_methods},
    {Py_tp_getset, Membuf_getset},
    {Py_tp_doc, (void *)"buffer(obj=None)\n--\n\nBuffer."},
    {Py_sq_length, (void *)Membuf_length},
    {Py_sq_item, (void *)Membuf_item},
    {Py_mp_length, (void *)Membuf_length},
    {Py_mp_subscript, (void *)Membuf_subscript},
    {Py_mp_ass_subscript, (void *)Membuf_ass_subscript},
    {Py_bf_getbuffer, (void *)Membuf_getbuffer},
    {0, NULL},
};

/* final, as in mpi4py (no BASETYPE); immutable, as a static type was */
static PyType_Spec Membuf_spec = {
    MEMBUF_NAME, sizeof(MembufObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Membuf_slots,
};

/* asbuffer(obj, readonly): `obj` itself when it is a buffer (checking that a
   writable one is writable), else a new buffer over any contiguous export;
   what mpi4py uses for Attach_buffer, Free_mem and friends. */
static PyObject *mod_asbuffer(PyObject *mod, PyObject *args)
{
    PyObject *obj;
    int readonly = 1;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O|p:asbuffer", &obj, &readonly))
        return NULL;
    if (Py_TYPE(obj) == Membuf_Type) {
        if (((MembufObject *)obj)->view.readonly && !readonly) {
            PyErr_SetString(PyExc_BufferError, "Object is not writable");
            return NULL;
        }
        Py_INCREF(obj);
        return obj;
    }
    return (PyObject *)membuf_from(obj, readonly ? PyBUF_ANY_CONTIGUOUS
                                                 : (PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE));
}


/* ---- MPI handle base ------------------------------------------------------ */

/* The base of every MPI handle class (Datatype, Comm, Request, ...): one
 * unsigned 64-bit field holding the object's MPI handle in C memory, as
 * mpi4py's objects hold theirs (ob_mpi).  Python reads and writes it through
 * the member descriptor `_h` (each class may alias it under its own name);
 * `addressof(obj)` gives the field's address, so that C code (ctypes, cffi)
 * can read a handle or write one into an object (MPI._addressof).
 * `fast` (`_fast`) is a communicator's state of the one-call paths, which
 * Comm sets when it builds the object: the engine's C methods read it at
 * FAST_OFFSET (NULL: they hand the call to the Python method). */
typedef struct {
    PyObject_HEAD
    uint64_t handle;
    PyObject *fast;
} HandleObject;

static PyTypeObject *Handle_Type;

/* a heap base type's dealloc frees the object and drops the instance's
   reference to its type (subtype_dealloc leaves that to the heap base) */
static void Handle_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    Py_CLEAR(((HandleObject *)self)->fast);
    tp_free(self);
    Py_DECREF((PyObject *)tp);
}

static PyMemberDef Handle_members[] = {
    {"_h", T_ULONGLONG, offsetof(HandleObject, handle), 0,
     "The MPI handle, as stored in the object's C memory."},
    {"_fast", T_OBJECT_EX, offsetof(HandleObject, fast), 0,
     "A communicator's state of the one-call paths (unset until Comm sets it)."},
    {NULL, 0, 0, 0, NULL},
};

/* no Py_tp_new: object's, so `object.__new__(cls)` still makes instances of
   the Python subclasses (with the handle zeroed) */
static PyType_Slot Handle_slots[] = {
    {Py_tp_dealloc, (void *)Handle_dealloc},
    {Py_tp_members, Handle_members},
    {Py_tp_doc, (void *)"Base of the MPI handle classes: the handle in C memory."},
    {0, NULL},
};

static PyType_Spec Handle_spec = {
    "erdmampi._membuf.handle", sizeof(HandleObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, Handle_slots,
};

/* addressof(obj): the address of obj's handle field */
static PyObject *mod_addressof(PyObject *mod, PyObject *obj)
{
    (void)mod;
    if (Handle_Type == NULL || !PyObject_TypeCheck(obj, Handle_Type)) {
        PyErr_SetString(PyExc_TypeError, "expecting an MPI handle object");
        return NULL;
    }
    return PyLong_FromVoidPtr(&((HandleObject *)obj)->handle);
}

/* ---- empty exporter ------------------------------------------------------ */

/* The base of MPI.BOTTOM, IN_PLACE and BUFFER_AUTOMATIC's types: like
   mpi4py's constants they export an empty buffer owned by no object
   (memoryview(BOTTOM).nbytes == 0, .obj is None); the buffer parser tests
   for them by identity before it asks any object for its buffer. */
static int EmptyExport_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    (void)self;
    return PyBuffer_FillInfo(view, NULL, NULL, 0, 0, flags);
}

static PyType_Slot EmptyExport_slots[] = {
    {Py_bf_getbuffer, (void *)EmptyExport_getbuffer},
    {Py_tp_doc, "Base of the buffer constants: exports an empty buffer."},
    {0, NULL},
};

static PyType_Spec EmptyExport_spec = {
    "erdmampi._membuf.empty_export", sizeof(PyObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, EmptyExport_slots,
};

static PyMethodDef module_methods[] = {
    {"asbuffer", mod_asbuffer, METH_VARARGS,
     "asbuffer(obj, readonly=True)\n--\n\nBuffer object over a buffer-like object."},
    {"addressof", mod_addressof, METH_O,
     "addressof(obj)\n--\n\nAddress of the handle field of an MPI handle object."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef membuf_module = {
    PyModuleDef_HEAD_INIT, "_membuf",
    "The MPI.buffer type and the base of the MPI handle classes.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

/* single-phase init: the type lives in a static; should init run again (a
   subinterpreter), the newest type replaces it */
PyMODINIT_FUNC PyInit__membuf(void)
{
    PyObject *m, *type;
    PyTypeObject *old;
    type = PyType_FromSpec(&Membuf_spec);
    if (type == NULL)
        return NULL;
    m = PyModule_Create(&membuf_module);
    if (m == NULL || PyModule_AddObjectRef(m, "buffer", type) < 0) {
        Py_XDECREF(m);
        Py_DECREF(type);
        return NULL;
    }
    old = Membuf_Type;
    Membuf_Type = (PyTypeObject *)type;   /* the static's own reference */
    Py_XDECREF((PyObject *)old);
    type = PyType_FromSpec(&EmptyExport_spec);
    if (type == NULL || PyModule_AddObjectRef(m, "empty_export", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(type);
    type = PyType_FromSpec(&Handle_spec);
    if (type == NULL || PyModule_AddObjectRef(m, "handle", type) < 0
            || PyModule_AddIntConstant(m, "HANDLE_SIZE", (long)sizeof(uint64_t)) < 0
            || PyModule_AddIntConstant(m, "FAST_OFFSET",
                                       (long)offsetof(HandleObject, fast)) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    old = Handle_Type;
    Handle_Type = (PyTypeObject *)type;   /* the static's own reference */
    Py_XDECREF((PyObject *)old);
    return m;
}
