/* engine._hot: the engine's three hot calls (claim, complete_many, complete_and_claim) as
 * CPython methods of a base class of engine.Engine, and the C base of engine.Claims.
 *
 * Why a module apart from the cffi core: a cffi call costs little, but the Python around it
 * (argument checks, arena bookkeeping, building the result) cost about 1 us per claim, more than
 * the claim pass itself. Here the common case (plain ints in range, the latest batch completed)
 * runs in C; every other case calls back into the Python layer, which validates and raises the
 * same errors as before. The core is not compiled twice: engine/shm/engine.py hands this module the
 * addresses of rl_claim_req, rl_complete_req and rl_complete_claim_req from the cffi module.
 *
 * Order in every call: whatever may run Python (argument checks, a new arena, the hooks) first,
 * then bind() copies the request block, then the core runs with the GIL held and nothing in
 * between. So no other thread can close the engine between the copy and the core's return,
 * and a handle is never used after rl_close freed it.
 *
 * Hooks it calls on the Python subclass (engine/shm/engine.py): _claim_args (validation of unusual
 * claim arguments), _now, _bind (the request block for this process, or EngineClosed), _after
 * (advice), _refused (raise for a negative status), _rows_tokens (convert any rows/tokens) and
 * _complete_many_any (complete_many of anything but the latest batch).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <structmember.h>
#include <time.h>

#include "lanes.h"

#define STRIDE_MS (INT64_C(1) << 42)
#define ARENA 8192       /* int64 values (or ok flags) per arena */

/* A claim's defaults and bounds: engine/api.py holds them, and this module reads them from it
 * when it loads (read_limits), so the Python and C layers cannot disagree. */
static struct {
    int64_t budget, lease_ms, window;  /* defaults */
    int64_t max_budget, max_window;
} lim;

typedef int64_t (*claim_fn)(const rl_req *, int64_t, uint32_t);
typedef int64_t (*complete_fn)(const rl_req *, uint32_t, const int64_t *, const int64_t *,
                               int64_t, uint8_t *);
typedef int64_t (*complete_claim_fn)(const rl_req *, uint32_t, const int64_t *, const int64_t *,
                                     int64_t, uint8_t *, uint32_t);

static claim_fn core_claim;
static complete_fn core_complete;
static complete_claim_fn core_complete_claim;
static PyTypeObject *claims_type;       /* engine.Claims, a subclass of ClaimsBase */
static PyObject *np_empty, *np_zeros, *np_int64, *np_bool;
static PyObject *s_claim_args, *s_now, *s_bind, *s_after, *s_rows_tokens, *s_complete_many_any;

/* Bumped in every forked child: a request block bound in another generation is another
 * process's (its owner id is the parent's). Starts at 1 so that 0 means "never bound". */
static volatile uint64_t fork_gen = 1;
static void after_fork_in_child(void) { fork_gen++; }

/* ---- ClaimsBase ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *buf;        /* the arena the C pass wrote: rows, lanes, due_ms, tokens */
    int64_t *base;        /* its data */
    Py_ssize_t o, n, b;   /* offset of the rows, count, and the distance between fields */
    PyObject *rows, *tokens;  /* views made when asked for; kept until the batch is completed */
} Claims;

static void claims_dealloc(Claims *c) {
    Py_XDECREF(c->buf);
    Py_XDECREF(c->rows);
    Py_XDECREF(c->tokens);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *claims_field(Claims *c, Py_ssize_t k) {
    Py_ssize_t start = c->o + k * c->b;
    return PySequence_GetSlice(c->buf, start, start + c->n);
}

static PyObject *claims_rows(Claims *c, void *unused) {
    if (!c->rows && !(c->rows = claims_field(c, 0))) return NULL;
    return Py_NewRef(c->rows);
}
static PyObject *claims_tokens(Claims *c, void *unused) {
    if (!c->tokens && !(c->tokens = claims_field(c, 3))) return NULL;
    return Py_NewRef(c->tokens);
}
static PyObject *claims_lanes(Claims *c, void *unused) { return claims_field(c, 1); }
static PyObject *claims_due(Claims *c, void *unused) { return claims_field(c, 2); }
static Py_ssize_t claims_len(Claims *c) { return c->n; }

static PyGetSetDef claims_getset[] = {
    {"rows", (getter)claims_rows, NULL, "Row ids (int64 array).", NULL},
    {"lanes", (getter)claims_lanes, NULL, "Lane of each row when claimed.", NULL},
    {"due_ms", (getter)claims_due, NULL, "True due time of each row.", NULL},
    {"tokens", (getter)claims_tokens, NULL, "Fencing token of each lease.", NULL},
    {NULL},
};

static PyMemberDef claims_members[] = {
    {"_buf", T_OBJECT, offsetof(Claims, buf), READONLY, NULL},
    {"_o", T_PYSSIZET, offsetof(Claims, o), READONLY, NULL},
    {"_n", T_PYSSIZET, offsetof(Claims, n), READONLY, NULL},
    {"_b", T_PYSSIZET, offsetof(Claims, b), READONLY, NULL},
    {NULL},
};

static PySequenceMethods claims_seq = {.sq_length = (lenfunc)claims_len};

static PyTypeObject ClaimsBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine._hot.ClaimsBase",
    .tp_basicsize = sizeof(Claims),
    .tp_dealloc = (destructor)claims_dealloc,
    .tp_as_sequence = &claims_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The rows one claim pass leased: views of an arena the C pass filled. Made only "
              "by the engine.",
    .tp_getset = claims_getset,
    .tp_members = claims_members,
};

/* ---- EngineBase ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *req_obj;    /* the Segment's request block (cffi cdata), kept alive */
    rl_req *req;          /* handle and owner; NULL handle once the segment is closed */
    uint64_t gen;         /* fork generation `req` was bound in (0: never) */
    PyObject *arena;      /* int64 claim results, carved in 4 * budget slots; replaced when full */
    char *arena_ptr;      /* its data */
    Py_ssize_t arena_len, arena_off;
    PyObject *ok;         /* complete_many's flags, carved the same way */
    char *ok_ptr;
    Py_ssize_t ok_len, ok_off;
    Claims *last;         /* the latest batch, until it is completed */
} Hot;

static void hot_dealloc(Hot *h) {
    PyTypeObject *tp = Py_TYPE(h);
    if (tp->tp_flags & Py_TPFLAGS_HAVE_GC) PyObject_GC_UnTrack(h);
    Py_CLEAR(h->req_obj);
    Py_CLEAR(h->arena);
    Py_CLEAR(h->ok);
    Py_CLEAR(h->last);
    tp->tp_free((PyObject *)h);
}

static int hot_traverse(Hot *h, visitproc visit, void *arg) {
    Py_VISIT(h->req_obj);
    Py_VISIT(h->arena);
    Py_VISIT(h->ok);
    Py_VISIT(h->last);
    return 0;
}

static int hot_clear(Hot *h) {
    Py_CLEAR(h->req_obj);
    h->req = NULL;
    Py_CLEAR(h->arena);
    h->arena_ptr = NULL;
    h->arena_len = h->arena_off = 0;
    Py_CLEAR(h->ok);
    h->ok_ptr = NULL;
    h->ok_len = h->ok_off = 0;
    Py_CLEAR(h->last);
    return 0;
}

/* A fresh numpy array of n values from `make` (np.empty / np.zeros) and its data pointer. */
static PyObject *new_array(PyObject *make, Py_ssize_t n, PyObject *dtype, void **data) {
    PyObject *arr = PyObject_CallFunction(make, "nO", n, dtype);
    if (!arr) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    *data = view.buf;  /* the array owns the memory and never resizes: the pointer stays valid */
    PyBuffer_Release(&view);
    return arr;
}

/* Room reserved in an arena for one call: the arena (a reference the call holds, so an arena
 * replaced meanwhile, by a hook's Python or another thread, frees nothing under it), its data,
 * and the offset. */
typedef struct {
    PyObject *arr;
    char *base;
    Py_ssize_t off, len;
} Slot;

/* Reserve `len` values of `size` bytes in *arena (replaced by a fresh one from `make` when
 * full); 0, or -1 with an exception. */
static int reserve(PyObject **arena, char **ptr, Py_ssize_t *alen, Py_ssize_t *aoff,
                   PyObject *make, PyObject *dtype, Py_ssize_t len, Slot *out) {
    if (*aoff + len > *alen) {
        Py_ssize_t n = len > ARENA ? len : ARENA;
        void *data;
        PyObject *arr = new_array(make, n, dtype, &data);
        if (!arr) return -1;
        Py_XSETREF(*arena, arr);  /* batches still out keep the old arena alive */
        *ptr = data;
        *alen = n;
        *aoff = 0;
    }
    out->arr = Py_NewRef(*arena);
    out->base = *ptr;
    out->off = *aoff;
    out->len = len;
    *aoff += len;
    return 0;
}

/* 4 * b claim results (rows, lanes, due_ms, tokens, b apart). */
static int claim_slot(Hot *h, Py_ssize_t b, Slot *out) {
    return reserve(&h->arena, &h->arena_ptr, &h->arena_len, &h->arena_off, np_empty,
                   np_int64, 4 * b, out);
}

/* n completion flags. */
static int ok_slot(Hot *h, Py_ssize_t n, Slot *out) {
    return reserve(&h->ok, &h->ok_ptr, &h->ok_len, &h->ok_off, np_zeros, np_bool, n, out);
}

/* Give back a slot the call did not use (its room too, when nothing was reserved after it). */
static void give_back(PyObject *arena, Py_ssize_t *aoff, Slot *slot) {
    if (arena == slot->arr && *aoff == slot->off + slot->len) *aoff = slot->off;
    Py_DECREF(slot->arr);
}

/* The request block for this call, bound to this process (the Python layer re-binds it after a
 * fork, and raises EngineClosed for a closed engine). */
static int bind(Hot *h, rl_req *r) {
    if (!h->req || !claims_type || !core_claim) {
        PyErr_SetString(PyExc_RuntimeError,
                        "engine is not initialised (engine._hot.setup and Engine.__init__ do it)");
        return -1;
    }
    if (!h->req->s || h->gen != fork_gen) {
        PyObject *res = PyObject_CallMethodNoArgs((PyObject *)h, s_bind);
        if (!res) return -1;
        Py_DECREF(res);
        if (!h->req->s) {
            PyErr_SetString(PyExc_RuntimeError, "_bind left the request block unbound");
            return -1;
        }
        h->gen = fork_gen;
    }
    *r = *h->req;  /* a copy per call: threads sharing an engine cannot see each other's budget */
    return 0;
}

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A plain int in [lo, hi] (absent: dflt). 0 when it is anything else, for the Python layer. */
static int fast_int(PyObject *o, int64_t dflt, int64_t lo, int64_t hi, int64_t *out) {
    if (!o) {
        *out = dflt;
        return 1;
    }
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* now_ms: None or absent reads the clock; a plain int in range passes; else 0. */
static int fast_now(PyObject *o, int64_t *out) {
    if (!o || o == Py_None) {
        *out = wall_ms();
        return 1;
    }
    return fast_int(o, 0, 0, STRIDE_MS - 1, out);
}

static int64_t as_i64(PyObject *o) { return (int64_t)PyLong_AsLongLong(o); }

/* now_ms of anything but the plain cases, through the Python layer's check. */
static int slow_now(Hot *h, PyObject *o, int64_t *out) {
    PyObject *v = PyObject_CallMethodOneArg((PyObject *)h, s_now, o);
    if (!v) return -1;
    *out = as_i64(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* Keyword/positional parsing for a fixed parameter list; absent values are left NULL. */
static int parse(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 PyObject **names, int nnames, int required, PyObject **out) {
    for (int i = 0; i < nnames; i++) out[i] = NULL;
    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, nnames,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int i = 0; i < nnames && found < 0; i++)
            if (key == names[i]) found = i;
        for (int i = 0; i < nnames && found < 0; i++)
            if (PyUnicode_Compare(key, names[i]) == 0) found = i;
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
        if (out[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", fname, key);
            return -1;
        }
        out[found] = args[nargs + k];
    }
    for (int i = 0; i < required; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%U'", fname, names[i]);
            return -1;
        }
    return 0;
}

typedef struct { int64_t now, budget, lease, window; } claim_args;

/* This call's copy of the request block, with its claim's arguments and result slot. */
static void with_claim(rl_req *r, const claim_args *c, const Slot *out) {
    r->budget = (uint32_t)c->budget;
    r->lease_ms = c->lease;
    r->window = (uint32_t)c->window;
    r->arena = (int64_t *)out->base;
}

/* budget, now_ms, lease_ms, window: the plain case here, the rest through _claim_args. */
static int get_claim_args(Hot *h, PyObject **a, claim_args *c) {
    if (fast_int(a[0], lim.budget, 1, lim.max_budget, &c->budget) && fast_now(a[1], &c->now) &&
        fast_int(a[2], lim.lease_ms, 1, STRIDE_MS - 1, &c->lease) &&
        fast_int(a[3], lim.window, 1, lim.max_window, &c->window))
        return 0;
    PyObject *dflt[4] = {PyLong_FromLongLong(lim.budget), Py_None,
                         PyLong_FromLongLong(lim.lease_ms), PyLong_FromLongLong(lim.window)};
    PyObject *argv[5] = {(PyObject *)h};
    for (int i = 0; i < 4; i++) argv[i + 1] = a[i] ? a[i] : dflt[i];
    PyObject *t = NULL;
    if (dflt[0] && dflt[2] && dflt[3])
        t = PyObject_VectorcallMethod(s_claim_args, argv, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(dflt[0]);
    Py_XDECREF(dflt[2]);
    Py_XDECREF(dflt[3]);
    if (!t) return -1;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_RuntimeError, "_claim_args must return 4 ints");
        return -1;
    }
    c->now = as_i64(PyTuple_GET_ITEM(t, 0));
    c->budget = as_i64(PyTuple_GET_ITEM(t, 1));
    c->lease = as_i64(PyTuple_GET_ITEM(t, 2));
    c->window = as_i64(PyTuple_GET_ITEM(t, 3));
    Py_DECREF(t);
    return PyErr_Occurred() ? -1 : 0;
}

/* _after(advice): merge the ring, or repair after a dead owner. 0, or -1 with an exception. */
static int after(Hot *h, int64_t advice) {
    PyObject *v = PyLong_FromLongLong(advice);
    PyObject *r = v ? PyObject_CallMethodOneArg((PyObject *)h, s_after, v) : NULL;
    Py_XDECREF(v);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* _refused(status, what) raises the error of a negative status; NULL always. */
static PyObject *refused(Hot *h, int64_t status, const char *what) {
    PyObject *r = PyObject_CallMethod((PyObject *)h, "_refused", "Ls", (long long)status, what);
    if (r) {
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "%s: status %lld", what, (long long)status);
    }
    return NULL;
}

/* The batch of a claim result (count | advice << 32) in `slot` (its reference moves to the
 * batch); acts on the advice after. */
static PyObject *claimed(Hot *h, int64_t v, Slot *slot, Py_ssize_t b, const char *what) {
    if (v < 0) {
        give_back(h->arena, &h->arena_off, slot);  /* nothing was claimed */
        return refused(h, v, what);
    }
    Claims *c = (Claims *)claims_type->tp_alloc(claims_type, 0);
    if (!c) {
        Py_DECREF(slot->arr);
        return NULL;
    }
    c->buf = slot->arr;
    c->base = (int64_t *)slot->base;
    c->o = slot->off;
    c->n = (Py_ssize_t)(v & 0xFFFFFFFF);
    c->b = b;
    Py_XSETREF(h->last, (Claims *)Py_NewRef(c));
    if (v >> 32 && after(h, v >> 32) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

/* The latest batch, if rows/tokens are its own views (unchanged objects): taken off `last`,
 * returned as a new reference (it keeps the arena the pointers point into alive). */
static Claims *take_latest(Hot *h, PyObject *rows, PyObject *tokens) {
    Claims *last = h->last;
    if (!last || !last->rows || rows != last->rows || tokens != last->tokens) return NULL;
    h->last = NULL;  /* its reference moves to the caller */
    Py_CLEAR(last->rows);  /* freed with the caller's temporaries, not with the next batch */
    Py_CLEAR(last->tokens);
    return last;
}

/* The flags of `slot` as a bool array (a view); the slot's reference is released. */
static PyObject *ok_view(Slot *slot) {
    PyObject *v = PySequence_GetSlice(slot->arr, slot->off, slot->off + slot->len);
    Py_DECREF(slot->arr);
    return v;
}

static PyObject *s_names_claim[4], *s_names_complete[4], *s_names_cc[6];

static PyObject *hot_claim(Hot *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[4];
    claim_args c;
    rl_req r;
    Slot out;
    if (parse("claim", args, nargs, kwnames, s_names_claim, 4, 0, a) < 0 ||
        get_claim_args(h, a, &c) < 0 || claim_slot(h, c.budget, &out) < 0)
        return NULL;
    if (bind(h, &r) < 0) {
        give_back(h->arena, &h->arena_off, &out);
        return NULL;
    }
    with_claim(&r, &c, &out);
    int64_t v = core_claim(&r, c.now, (uint32_t)out.off);
    return claimed(h, v, &out, c.budget, "claim");
}

/* complete_many of anything but the latest batch, in the Python layer. */
static PyObject *complete_any(Hot *h, PyObject **a) {
    PyObject *argv[5] = {(PyObject *)h, a[0], a[1], a[2] ? a[2] : Py_None, a[3] ? a[3] : Py_None};
    return PyObject_VectorcallMethod(s_complete_many_any, argv, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     NULL);
}

static PyObject *hot_complete_many(Hot *h, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    PyObject *a[4];
    if (parse("complete_many", args, nargs, kwnames, s_names_complete, 4, 2, a) < 0) return NULL;
    Claims *last = h->last;
    if ((a[2] && a[2] != Py_None) || !last || !last->rows || a[0] != last->rows ||
        a[1] != last->tokens || last->n == 0)
        return complete_any(h, a);
    /* The arrays of the latest claim: their arena address is known, so they go to the core
     * without conversion (it checks every row id and token as before). */
    int64_t now;
    rl_req r;
    Slot oks;
    Py_ssize_t want = last->n; /* `last` may be gone after the next calls: they can run Python */
    if ((!fast_now(a[3], &now) && slow_now(h, a[3], &now) < 0) || ok_slot(h, want, &oks) < 0)
        return NULL;
    if (bind(h, &r) < 0 || !(last = take_latest(h, a[0], a[1])) || last->n != oks.len) {
        /* closed; or the calls above ran Python that claimed again: the general path */
        Py_XDECREF(last);
        give_back(h->ok, &h->ok_off, &oks);
        return PyErr_Occurred() ? NULL : complete_any(h, a);
    }
    Py_ssize_t n = last->n;
    const int64_t *rows = last->base + last->o, *tokens = rows + 3 * last->b;
    uint8_t *ok = (uint8_t *)oks.base + oks.off;
    int64_t v = core_complete(&r, (uint32_t)n, rows, tokens, now, ok);
    Py_DECREF(last);
    if (v < 0 || (v >> 32 && after(h, v >> 32) < 0)) {
        Py_DECREF(oks.arr);
        return v < 0 ? refused(h, v, "complete_many") : NULL;
    }
    return ok_view(&oks);
}

static PyObject *hot_complete_and_claim(Hot *h, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames) {
    PyObject *a[6];
    claim_args c;
    rl_req r;
    if (parse("complete_and_claim", args, nargs, kwnames, s_names_cc, 6, 2, a) < 0 ||
        get_claim_args(h, a + 2, &c) < 0)
        return NULL;
    PyObject *keep = NULL;  /* what owns the rows and tokens' memory during the call */
    const int64_t *rows = NULL, *tokens = NULL;
    Py_ssize_t n = 0;
    Claims *last = take_latest(h, a[0], a[1]);
    if (last) {
        keep = (PyObject *)last;
        n = last->n;
        rows = last->base + last->o;
        tokens = rows + 3 * last->b;
    } else {
        PyObject *argv[3] = {(PyObject *)h, a[0], a[1]};
        keep = PyObject_VectorcallMethod(s_rows_tokens, argv, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         NULL);
        if (!keep) return NULL;
        Py_buffer vr, vt;
        if (!PyTuple_Check(keep) || PyTuple_GET_SIZE(keep) != 2) {
            PyErr_SetString(PyExc_RuntimeError, "_rows_tokens must return two arrays");
            Py_DECREF(keep);
            return NULL;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(keep, 0), &vr, PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(keep);
            return NULL;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(keep, 1), &vt, PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&vr);
            Py_DECREF(keep);
            return NULL;
        }
        n = vr.len / (Py_ssize_t)sizeof(int64_t);
        rows = vr.buf;
        tokens = vt.buf;
        int same = vr.len == vt.len && vr.itemsize == sizeof(int64_t) && vt.itemsize == sizeof(int64_t);
        PyBuffer_Release(&vr);  /* `keep` holds the arrays, so their memory stays */
        PyBuffer_Release(&vt);
        if (!same) {
            PyErr_SetString(PyExc_RuntimeError, "_rows_tokens must return equal int64 arrays");
            Py_DECREF(keep);
            return NULL;
        }
    }
    Slot oks, out;
    if (ok_slot(h, n, &oks) < 0) {
        Py_DECREF(keep);
        return NULL;
    }
    if (claim_slot(h, c.budget, &out) < 0) {
        give_back(h->ok, &h->ok_off, &oks);
        Py_DECREF(keep);
        return NULL;
    }
    if (bind(h, &r) < 0) {
        give_back(h->arena, &h->arena_off, &out);
        give_back(h->ok, &h->ok_off, &oks);
        Py_DECREF(keep);
        return NULL;
    }
    with_claim(&r, &c, &out);
    uint8_t *ok = (uint8_t *)oks.base + oks.off;
    int64_t v = core_complete_claim(&r, (uint32_t)n, rows, tokens, c.now, ok, (uint32_t)out.off);
    Py_DECREF(keep);
    if (v < 0) give_back(h->ok, &h->ok_off, &oks); /* a refused call changed nothing */
    PyObject *batch = claimed(h, v, &out, c.budget, "complete_and_claim");
    if (!batch) {
        if (v >= 0) Py_DECREF(oks.arr);
        return NULL;
    }
    PyObject *okv = ok_view(&oks);
    if (!okv) {
        Py_DECREF(batch);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, okv, batch);
    Py_DECREF(okv);
    Py_DECREF(batch);
    return pair;
}

/* _set_request(req, address): the Segment's request block (cdata, and its address). */
static PyObject *hot_set_request(Hot *h, PyObject *args) {
    PyObject *obj;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "OK", &obj, &addr)) return NULL;
    Py_XSETREF(h->req_obj, Py_NewRef(obj));
    h->req = (rl_req *)(uintptr_t)addr;
    h->gen = 0;
    Py_RETURN_NONE;
}

/* The docstrings of the claim calls, with their signatures (the defaults in them are filled in
 * by read_limits). */
static char claim_doc[256], complete_claim_doc[640];
static const char claim_text[] =
    "Lease up to ``budget`` due rows across lanes, as the policy shares them; returns Claims.";
static const char complete_claim_text[] =
    "``complete_many(rows, tokens)`` then ``claim(budget, ...)`` at the same ``now_ms``, in\n"
    "one call into the C core: a worker's whole cycle with one crossing. Returns what\n"
    "``complete_many`` and ``claim`` return, as ``(ok, batch)``. Every argument is checked\n"
    "before anything changes: bad input raises and neither completes nor claims.";

static PyMethodDef hot_methods[] = {
    {"claim", (PyCFunction)(void (*)(void))hot_claim, METH_FASTCALL | METH_KEYWORDS, claim_doc},
    {"complete_many", (PyCFunction)(void (*)(void))hot_complete_many,
     METH_FASTCALL | METH_KEYWORDS,
     "complete_many($self, /, rows, tokens, next_due_ms=None, now_ms=None)\n--\n\n"
     "Complete a batch in one call; returns which leases were still held (and completed)."},
    {"complete_and_claim", (PyCFunction)(void (*)(void))hot_complete_and_claim,
     METH_FASTCALL | METH_KEYWORDS, complete_claim_doc},
    {"_set_request", (PyCFunction)hot_set_request, METH_VARARGS, NULL},
    {NULL},
};

static PyTypeObject EngineBase = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine._hot.EngineBase",
    .tp_basicsize = sizeof(Hot),
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The hot calls of engine.Engine, in C.",
    .tp_methods = hot_methods,
    .tp_new = PyType_GenericNew,
};

/* ---- module ---------------------------------------------------------------------------------- */

/* setup(claims_type, claim_req, complete_req, complete_claim_req): engine.Claims and the core's
 * entry points (addresses from the cffi module). */
static PyObject *mod_setup(PyObject *m, PyObject *args) {
    PyObject *type;
    unsigned long long f_claim, f_complete, f_cc;
    if (!PyArg_ParseTuple(args, "O!KKK", &PyType_Type, &type, &f_claim, &f_complete, &f_cc))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)type, &ClaimsBase) ||
        ((PyTypeObject *)type)->tp_basicsize != ClaimsBase.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "claims_type must subclass ClaimsBase with no new slots");
        return NULL;
    }
    if (!f_claim || !f_complete || !f_cc) {
        PyErr_SetString(PyExc_ValueError, "null core entry point");
        return NULL;
    }
    Py_XSETREF(claims_type, (PyTypeObject *)Py_NewRef(type));
    core_claim = (claim_fn)(uintptr_t)f_claim;
    core_complete = (complete_fn)(uintptr_t)f_complete;
    core_complete_claim = (complete_claim_fn)(uintptr_t)f_cc;
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"setup", mod_setup, METH_VARARGS, NULL},
    {NULL},
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT, "engine._hot", "The engine's hot calls in C (see csrc/hot.c).", -1,
    mod_methods,
};

static int intern_all(void) {
    static const char *claim[] = {"budget", "now_ms", "lease_ms", "window"};
    static const char *complete[] = {"rows", "tokens", "next_due_ms", "now_ms"};
    for (int i = 0; i < 4; i++) {
        if (!(s_names_claim[i] = PyUnicode_InternFromString(claim[i]))) return -1;
        if (!(s_names_complete[i] = PyUnicode_InternFromString(complete[i]))) return -1;
        s_names_cc[i + 2] = s_names_claim[i];
    }
    s_names_cc[0] = s_names_complete[0];
    s_names_cc[1] = s_names_complete[1];
    return (s_claim_args = PyUnicode_InternFromString("_claim_args")) &&
                   (s_now = PyUnicode_InternFromString("_now")) &&
                   (s_bind = PyUnicode_InternFromString("_bind")) &&
                   (s_after = PyUnicode_InternFromString("_after")) &&
                   (s_rows_tokens = PyUnicode_InternFromString("_rows_tokens")) &&
                   (s_complete_many_any = PyUnicode_InternFromString("_complete_many_any"))
               ? 0
               : -1;
}

/* One int64 attribute of a module, in [1, hi]. */
static int read_limit(PyObject *mod, const char *name, int64_t hi, int64_t *out) {
    PyObject *v = PyObject_GetAttrString(mod, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < 1 || x > hi) {
        PyErr_Format(PyExc_ValueError, "engine.api.%s = %lld is out of range", name, x);
        return -1;
    }
    *out = x;
    return 0;
}

/* The defaults and bounds from engine.api, and the docstrings that show them. */
static int read_limits(void) {
    PyObject *api = PyImport_ImportModule("engine.api");
    if (!api) return -1;
    int bad = read_limit(api, "MAX_BUDGET", UINT32_MAX, &lim.max_budget) ||
              read_limit(api, "MAX_WINDOW", UINT32_MAX, &lim.max_window) ||
              read_limit(api, "DEFAULT_BUDGET", lim.max_budget, &lim.budget) ||
              read_limit(api, "DEFAULT_LEASE_MS", STRIDE_MS - 1, &lim.lease_ms) ||
              read_limit(api, "DEFAULT_WINDOW", lim.max_window, &lim.window);
    Py_DECREF(api);
    if (bad) return -1;
    char sig[160];
    snprintf(sig, sizeof sig, "budget=%lld, now_ms=None, lease_ms=%lld, window=%lld",
             (long long)lim.budget, (long long)lim.lease_ms, (long long)lim.window);
    snprintf(claim_doc, sizeof claim_doc, "claim($self, /, %s)\n--\n\n%s", sig, claim_text);
    snprintf(complete_claim_doc, sizeof complete_claim_doc,
             "complete_and_claim($self, /, rows, tokens, %s)\n--\n\n%s", sig,
             complete_claim_text);
    return 0;
}

PyMODINIT_FUNC PyInit__hot(void) {
    if (read_limits() < 0 || PyType_Ready(&ClaimsBase) < 0 || PyType_Ready(&EngineBase) < 0 ||
        intern_all() < 0)
        return NULL;
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    np_empty = PyObject_GetAttrString(np, "empty");
    np_zeros = PyObject_GetAttrString(np, "zeros");
    np_int64 = PyObject_GetAttrString(np, "int64");
    np_bool = PyObject_GetAttrString(np, "bool_");
    Py_DECREF(np);
    if (!np_empty || !np_zeros || !np_int64 || !np_bool) return NULL;
    if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
        return NULL;
    }
    PyObject *m = PyModule_Create(&hot_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "ClaimsBase", (PyObject *)&ClaimsBase) < 0 ||
        PyModule_AddObjectRef(m, "EngineBase", (PyObject *)&EngineBase) < 0 ||
        PyModule_AddIntConstant(m, "ARENA", ARENA) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
