/*
 * Fragmentation statistics and growth of a few nodes, node by node in C (``kernel.py`` says why and
 * when it is used; ``growth.py`` is the numpy version, and the definition it follows).
 *
 * A node's fragmentation under a typical workload is its free GPU milli less sum_t p_t * usable_t. Per
 * GPU group h (the milli a shape asks per GPU and the models it allows) a node keeps how many of its
 * GPUs could host one GPU of the group and their free milli; a shape's usable milli follows from its
 * group's figures and the node's free CPU class (whether its CPU fits, its cap under ``capped``). A
 * placement changes the figures only on the GPUs it takes.
 *
 * Every function takes the whole cluster's arrays and the node indices to work on, and writes per
 * node: no numpy call per decision but one call here. Arrays are checked for size by the caller
 * (``kernel.py``), which passes them C-contiguous and of the dtypes named below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef KERNEL_SOURCE /* the digest of this file, given by setup.py */
#define KERNEL_SOURCE "unknown"
#endif
#define MILLI_PER_GPU 1000
#define MAX_GPUS 64
#define MAX_GROUPS 256

typedef struct {
    Py_ssize_t gpus, groups, shapes, classes, models; /* G, H, T, C (breaks + 1), Z (models + 1) */
    int64_t *group_milli;  /* H */
    uint8_t *group_ok;     /* Z x H */
    int64_t *breaks;       /* C - 1, ascending */
    int64_t *shape_group;  /* T */
    int64_t *shape_count;  /* T */
    double *weight;        /* T */
    uint8_t *fits;         /* C x T */
    int64_t *cap;          /* C x T */
} Tables;

static const char *CAPSULE = "gpusched.placement.kernel.tables";

static void tables_free(PyObject *capsule) {
    Tables *t = (Tables *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (t == NULL) return;
    free(t->group_milli); free(t->group_ok); free(t->breaks); free(t->shape_group);
    free(t->shape_count); free(t->weight); free(t->fits); free(t->cap);
    free(t);
}

static void *copy_buffer(Py_buffer *b) {
    void *p = malloc(b->len > 0 ? (size_t)b->len : 1);
    if (p != NULL && b->len > 0) memcpy(p, b->buf, (size_t)b->len);
    return p;
}

/* tables(gpus, groups, shapes, classes, models, group_milli, group_ok, breaks, shape_group, shape_count,
 *        weight, fits, cap) -> capsule */
static PyObject *make_tables(PyObject *self, PyObject *args) {
    Py_ssize_t g, h, n, c, z;
    Py_buffer b[8];
    if (!PyArg_ParseTuple(args, "nnnnny*y*y*y*y*y*y*y*", &g, &h, &n, &c, &z, &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &b[7]))
        return NULL;
    Py_ssize_t want[8] = {h * 8, z * h, (c - 1) * 8, n * 8, n * 8, n * 8, c * n, c * n * 8};
    PyObject *result = NULL;
    for (int i = 0; i < 8; i++) {
        if (b[i].len != want[i]) {
            PyErr_Format(PyExc_ValueError, "kernel tables: array %d has %zd bytes, not %zd", i, b[i].len, want[i]);
            goto done;
        }
    }
    if (g < 1 || g > MAX_GPUS || h > MAX_GROUPS || c < 1) {
        PyErr_SetString(PyExc_ValueError, "kernel tables: too many GPUs per node or groups");
        goto done;
    }
    Tables *t = calloc(1, sizeof(Tables));
    if (t == NULL) { PyErr_NoMemory(); goto done; }
    t->gpus = g; t->groups = h; t->shapes = n; t->classes = c; t->models = z;
    t->group_milli = copy_buffer(&b[0]); t->group_ok = copy_buffer(&b[1]); t->breaks = copy_buffer(&b[2]);
    t->shape_group = copy_buffer(&b[3]); t->shape_count = copy_buffer(&b[4]); t->weight = copy_buffer(&b[5]);
    t->fits = copy_buffer(&b[6]); t->cap = copy_buffer(&b[7]);
    result = PyCapsule_New(t, CAPSULE, tables_free);
    if (result == NULL) {
        free(t->group_milli); free(t->group_ok); free(t->breaks); free(t->shape_group);
        free(t->shape_count); free(t->weight); free(t->fits); free(t->cap); free(t);
    }
done:
    for (int i = 0; i < 8; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* The free CPU class: how many breaks are <= cpu (numpy's searchsorted(..., side="right")). */
static inline Py_ssize_t cpu_class(const Tables *t, int64_t cpu) {
    Py_ssize_t lo = 0, hi = t->classes - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (t->breaks[mid] <= cpu) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* sum_t p_t * usable_t under fgd (out[0]) and capped (out[1]), from group figures and free CPU. */
static inline void usable_sums(const Tables *t, const int64_t *count, const int64_t *usable, int64_t cpu,
                               double *fgd, double *capped) {
    Py_ssize_t c = cpu_class(t, cpu);
    const uint8_t *fits = t->fits + c * t->shapes;
    const int64_t *cap = t->cap + c * t->shapes;
    double a = 0.0, b = 0.0;
    for (Py_ssize_t k = 0; k < t->shapes; k++) {
        int64_t h = t->shape_group[k];
        if (!fits[k] || count[h] < t->shape_count[k]) continue;
        int64_t u = usable[h];
        a += t->weight[k] * (double)u;
        b += t->weight[k] * (double)(u < cap[k] ? u : cap[k]);
    }
    *fgd = a;
    *capped = b;
}

/* Group figures of one node's GPUs: free milli free[G], model ids model[G]. */
static inline void group_stats(const Tables *t, const int64_t *free_milli, const int64_t *model, int64_t *count,
                               int64_t *usable) {
    for (Py_ssize_t h = 0; h < t->groups; h++) { count[h] = 0; usable[h] = 0; }
    for (Py_ssize_t g = 0; g < t->gpus; g++) {
        const uint8_t *ok = t->group_ok + model[g] * t->groups;
        int64_t f = free_milli[g];
        for (Py_ssize_t h = 0; h < t->groups; h++) {
            if (ok[h] && f >= t->group_milli[h]) { count[h] += 1; usable[h] += f; }
        }
    }
}

/* A node's kept figures (``RowState``): its group figures, fragmentation under each measure asked (free milli -
 * usable) and free CPU class, from its GPUs' free milli (``share_free`` row) and models. */
static inline void node_stats(const Tables *t, const int32_t *share_free, const int64_t *model, int64_t total,
                              int64_t cpu, int64_t *count, int64_t *usable, double *fgd, double *capped,
                              int64_t *klass) {
    int64_t free_milli[MAX_GPUS];
    for (Py_ssize_t g = 0; g < t->gpus; g++) free_milli[g] = share_free[g];
    group_stats(t, free_milli, model, count, usable);
    double a, c;
    usable_sums(t, count, usable, cpu, &a, &c);
    if (fgd) *fgd = (double)total - a;
    if (capped) *capped = (double)total - c;
    *klass = cpu_class(t, cpu);
}

static inline double rounded(double growth) {
    /* numpy's ndarray.round(6) (multiply, rint, divide), then + 0.0: a zero is +0.0 */
    return rint(growth * 1e6) / 1e6 + 0.0;
}

typedef struct {
    Py_buffer views[48];
    int used;
} Buffers;

static void release_all(Buffers *b) {
    for (int i = 0; i < b->used; i++) PyBuffer_Release(&b->views[i]);
    b->used = 0;
}

/* A C-contiguous buffer of ``count`` items of ``size`` bytes (None allowed when ``optional``). */
static int take(Buffers *b, PyObject *obj, int writable, Py_ssize_t count, Py_ssize_t size, int optional,
                const char *name, void **out) {
    if (obj == Py_None && optional) { *out = NULL; return 0; }
    if (b->used >= (int)(sizeof(b->views) / sizeof(b->views[0]))) {
        PyErr_SetString(PyExc_RuntimeError, "kernel: too many arrays in one call");
        return -1;
    }
    Py_buffer *view = &b->views[b->used];
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0) return -1;
    b->used++;
    if (view->len != count * size) {
        PyErr_Format(PyExc_ValueError, "kernel: %s has %zd bytes, not %zd", name, view->len, count * size);
        return -1;
    }
    *out = view->buf;
    return 0;
}

static Tables *tables_of(PyObject *capsule) {
    return (Tables *)PyCapsule_GetPointer(capsule, CAPSULE);
}

/* stats(tables, share_free (N,G) int32, gpu_model (N,G) int64, total (N,) int64, cpu_free (N,) int64,
 *       rows (R,) int64, count (N,H) int64 out, usable (N,H) int64 out, fgd (N,) f64 out | None,
 *       capped (N,) f64 out | None, cpu_class (N,) int64 out) -> None
 * The rows' group figures, fragmentation under each measure asked (free milli - usable) and CPU class. */
static PyObject *stats(PyObject *self, PyObject *args) {
    PyObject *capsule, *o[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOO", &capsule, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9]))
        return NULL;
    Tables *t = tables_of(capsule);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyObject_Length(o[2]), r = PyObject_Length(o[4]);
    if (n < 0 || r < 0) return NULL;
    Py_ssize_t G = t->gpus, H = t->groups;
    Buffers b = {.used = 0};
    int32_t *share_free; int64_t *gpu_model, *total, *cpu_free, *rows, *count, *usable, *klass;
    double *fgd, *capped;
    if (take(&b, o[0], 0, n * G, 4, 0, "share_free", (void **)&share_free) ||
        take(&b, o[1], 0, n * G, 8, 0, "gpu_model", (void **)&gpu_model) ||
        take(&b, o[2], 0, n, 8, 0, "total", (void **)&total) ||
        take(&b, o[3], 0, n, 8, 0, "cpu_free", (void **)&cpu_free) ||
        take(&b, o[4], 0, r, 8, 0, "rows", (void **)&rows) ||
        take(&b, o[5], 1, n * H, 8, 0, "count", (void **)&count) ||
        take(&b, o[6], 1, n * H, 8, 0, "usable", (void **)&usable) ||
        take(&b, o[7], 1, n, 8, 1, "fgd", (void **)&fgd) ||
        take(&b, o[8], 1, n, 8, 1, "capped", (void **)&capped) ||
        take(&b, o[9], 1, n, 8, 0, "cpu_class", (void **)&klass)) {
        release_all(&b);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < r; i++) {
        int64_t row = rows[i];
        if (row < 0 || row >= n) { release_all(&b); PyErr_SetString(PyExc_IndexError, "kernel: row out of range"); return NULL; }
        node_stats(t, share_free + row * G, gpu_model + row * G, total[row], cpu_free[row], count + row * H,
                   usable + row * H, fgd ? fgd + row : NULL, capped ? capped + row : NULL, klass + row);
    }
    release_all(&b);
    Py_RETURN_NONE;
}

/* A step's inputs (``step`` and ``choose``): a tuple (old_share_free (N,G) int32, new_share_free, old_cpu (N,) int64,
 * new_cpu, old_gpu_memory (N,G) int64 | None, new_gpu_memory | None, among (R,) int64 | None, gpu_model (N,G) int64,
 * total (N,) int64, version (N,) int64 out, clock, count (N,H) int64 out, usable out, fgd (N,) f64 out | None,
 * capped out | None, cpu_class (N,) int64 out, out (R or N,) int64, old_total (N,) int64 | None, node_class (N,)
 * int64 | None, class_free (K,) int64 out | None). */
typedef struct {
    int32_t *old_free, *new_free;
    int64_t *old_cpu, *new_cpu, *old_memory, *new_memory, *among, *gpu_model, *total, *version, *count, *usable,
        *klass, *out, *old_total, *node_class, *class_free;
    double *fgd, *capped;
    long long clock;
    Py_ssize_t r, classes;
} StepIn;

static int step_take(Buffers *b, const Tables *t, PyObject *args, Py_ssize_t n, StepIn *s) {
    PyObject *o[20];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOLOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &s->clock, &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &o[17],
                          &o[18]))
        return -1;
    Py_ssize_t G = t->gpus, H = t->groups;
    s->r = n;
    s->classes = 0;
    if (o[6] != Py_None && (s->r = PyObject_Length(o[6])) < 0) return -1;
    if (o[18] != Py_None && (s->classes = PyObject_Length(o[18])) < 0) return -1;
    if (take(b, o[0], 0, n * G, 4, 0, "old_share_free", (void **)&s->old_free) ||
        take(b, o[1], 0, n * G, 4, 0, "new_share_free", (void **)&s->new_free) ||
        take(b, o[2], 0, n, 8, 0, "old_cpu", (void **)&s->old_cpu) ||
        take(b, o[3], 0, n, 8, 0, "new_cpu", (void **)&s->new_cpu) ||
        take(b, o[4], 0, n * G, 8, 1, "old_gpu_memory", (void **)&s->old_memory) ||
        take(b, o[5], 0, n * G, 8, 1, "new_gpu_memory", (void **)&s->new_memory) ||
        take(b, o[6], 0, s->r, 8, 1, "among", (void **)&s->among) ||
        take(b, o[7], 0, n * G, 8, 0, "gpu_model", (void **)&s->gpu_model) ||
        take(b, o[8], 0, n, 8, 0, "total", (void **)&s->total) ||
        take(b, o[9], 1, n, 8, 0, "version", (void **)&s->version) ||
        take(b, o[10], 1, n * H, 8, 0, "count", (void **)&s->count) ||
        take(b, o[11], 1, n * H, 8, 0, "usable", (void **)&s->usable) ||
        take(b, o[12], 1, n, 8, 1, "fgd", (void **)&s->fgd) ||
        take(b, o[13], 1, n, 8, 1, "capped", (void **)&s->capped) ||
        take(b, o[14], 1, n, 8, 0, "cpu_class", (void **)&s->klass) ||
        take(b, o[15], 1, s->r, 8, 1, "out", (void **)&s->out) ||
        take(b, o[16], 0, n, 8, 1, "old_total", (void **)&s->old_total) ||
        take(b, o[17], 0, n, 8, 1, "node_class", (void **)&s->node_class) ||
        take(b, o[18], 1, s->classes, 8, 1, "class_free", (void **)&s->class_free))
        return -1;
    if (s->class_free && !(s->old_total && s->node_class)) {
        PyErr_SetString(PyExc_ValueError, "kernel: free GPU per class kept in step needs node classes and old totals");
        return -1;
    }
    return 0;
}

/* The nodes that changed get version ``clock``, their statistics again and (when kept) their class's free GPU
 * moved by what they gained; written to ``out`` when given. Returns how many changed, or -1 (an error set). */
static Py_ssize_t step_run(const Tables *t, StepIn *s, Py_ssize_t n) {
    Py_ssize_t G = t->gpus, H = t->groups, k = 0;
    int memory = s->old_memory && s->new_memory;
    for (Py_ssize_t i = 0; i < s->r; i++) {
        Py_ssize_t row = s->among ? s->among[i] : i;
        if (row < 0 || row >= n) { PyErr_SetString(PyExc_IndexError, "kernel: row out of range"); return -1; }
        if (s->old_cpu[row] == s->new_cpu[row] &&
            memcmp(s->old_free + row * G, s->new_free + row * G, (size_t)G * 4) == 0 &&
            !(memory && memcmp(s->old_memory + row * G, s->new_memory + row * G, (size_t)G * 8) != 0))
            continue;
        if (s->class_free) {
            int64_t c = s->node_class[row];
            if (c < 0 || c >= s->classes) { PyErr_SetString(PyExc_IndexError, "kernel: node class out of range"); return -1; }
            s->class_free[c] += s->total[row] - s->old_total[row];
        }
        if (s->out) s->out[k] = row;
        k++;
        s->version[row] = s->clock;
        node_stats(t, s->new_free + row * G, s->gpu_model + row * G, s->total[row], s->new_cpu[row],
                   s->count + row * H, s->usable + row * H, s->fgd ? s->fgd + row : NULL,
                   s->capped ? s->capped + row : NULL, s->klass + row);
    }
    return k;
}

/* step(tables, inputs) -> count: ``changed`` and ``stats`` in one pass (``RowState.sync``): the nodes that changed
 * (among all, or among the ascending ``among``) get version ``clock`` and their statistics again, and are written
 * to ``out`` (see ``StepIn`` for the inputs). */
static PyObject *step(PyObject *self, PyObject *args) {
    PyObject *capsule, *inputs;
    if (!PyArg_ParseTuple(args, "OO!", &capsule, &PyTuple_Type, &inputs)) return NULL;
    Tables *t = tables_of(capsule);
    if (t == NULL) return NULL;
    if (PyTuple_GET_SIZE(inputs) < 3) { PyErr_SetString(PyExc_ValueError, "kernel: step needs its inputs"); return NULL; }
    Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(inputs, 2));
    if (n < 0) return NULL;
    Buffers b = {.used = 0};
    StepIn s;
    if (step_take(&b, t, inputs, n, &s)) { release_all(&b); return NULL; }
    Py_ssize_t k = step_run(t, &s, n);
    release_all(&b);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

enum { KIND_NONE = 0, KIND_WHOLE = 1, KIND_SHARE = 2 };

/* What growth depends on besides the tables: the request and the cluster's arrays (whole cluster). */
typedef struct {
    int kind;
    int64_t milli, gpu_count, cpu_milli, gpu_memory;
    const int32_t *share_free;      /* N x G */
    const int64_t *gpu_model;       /* N x G */
    const uint8_t *allowed;         /* N x G, or NULL: every GPU */
    const int64_t *gpu_memory_free; /* N x G, or NULL when the request asks no GPU memory */
    const int64_t *total;           /* N */
    const int64_t *cpu_free;        /* N */
    const int64_t *count, *usable;  /* N x H, the kept group figures */
    const double *before_fgd, *before_capped; /* N, or NULL for a measure not asked */
} Growth;

/* Growth of node ``row``'s fragmentation if the request went there: a share writes G values per measure
 * (+inf on the GPUs it does not fit), other kinds one. ``fg``/``cg`` may be NULL (measure not asked). */
static void row_growth(const Tables *t, const Growth *q, int64_t row, double *fg, double *cg) {
    Py_ssize_t G = t->gpus, H = t->groups;
    const int64_t *model = q->gpu_model + row * G;
    const int64_t *row_count = q->count + row * H, *row_usable = q->usable + row * H;
    int64_t cpu_after = q->cpu_free[row] - q->cpu_milli;
    int64_t free_milli[MAX_GPUS], cnt[MAX_GROUPS], use[MAX_GROUPS];
    for (Py_ssize_t g = 0; g < G; g++) {
        int64_t f = q->share_free[row * G + g];
        free_milli[g] = (q->allowed && !q->allowed[row * G + g]) ? 0 : f; /* what the request may take */
    }
    double a, c;
    if (q->kind == KIND_SHARE) {
        for (Py_ssize_t g = 0; g < G; g++) {
            int fits = free_milli[g] >= q->milli;
            if (fits && q->gpu_memory > 0 && q->gpu_memory_free) fits = q->gpu_memory_free[row * G + g] >= q->gpu_memory;
            if (!fits) {
                if (fg) fg[g] = INFINITY;
                if (cg) cg[g] = INFINITY;
                continue;
            }
            int64_t old = q->share_free[row * G + g], left = old - q->milli;
            Py_ssize_t same = -1; /* an earlier GPU of the node in the same state gives the same growth */
            for (Py_ssize_t e = 0; e < g && same < 0 && q->gpu_memory == 0; e++) {
                if (q->share_free[row * G + e] == old && model[e] == model[g] && free_milli[e] == free_milli[g])
                    same = e;
            }
            if (same >= 0) {
                if (fg) fg[g] = fg[same];
                if (cg) cg[g] = cg[same];
                continue;
            }
            const uint8_t *ok = t->group_ok + model[g] * H;
            for (Py_ssize_t h = 0; h < H; h++) {
                int was = ok[h] && old >= t->group_milli[h], now = ok[h] && left >= t->group_milli[h];
                cnt[h] = row_count[h] - was + now;
                use[h] = row_usable[h] - old * was + left * now;
            }
            usable_sums(t, cnt, use, cpu_after, &a, &c);
            double after_total = (double)(q->total[row] - q->milli);
            if (fg) fg[g] = rounded(after_total - a - q->before_fgd[row]);
            if (cg) cg[g] = rounded(after_total - c - q->before_capped[row]);
        }
        return;
    }
    int64_t after_total = q->total[row];
    const int64_t *stats_count = row_count, *stats_usable = row_usable;
    if (q->kind == KIND_WHOLE) {
        int64_t taken = 0, after_free[MAX_GPUS];
        for (Py_ssize_t g = 0; g < G; g++) {
            int64_t f = q->share_free[row * G + g];
            if (free_milli[g] == MILLI_PER_GPU && taken < q->gpu_count) { taken++; f = 0; }
            after_free[g] = f;
        }
        group_stats(t, after_free, model, cnt, use);
        after_total -= MILLI_PER_GPU * taken;
        stats_count = cnt; stats_usable = use;
    }
    usable_sums(t, stats_count, stats_usable, cpu_after, &a, &c);
    if (fg) fg[0] = rounded((double)after_total - a - q->before_fgd[row]);
    if (cg) cg[0] = rounded((double)after_total - c - q->before_capped[row]);
}

/* Parse a request and the cluster's arrays, args o[0..10]: share_free, gpu_model, allowed, gpu_memory_free,
 * total, cpu_free, count, usable, before_fgd, before_capped; n nodes. */
static int growth_inputs(Buffers *b, const Tables *t, PyObject **o, Py_ssize_t n, Growth *q) {
    Py_ssize_t G = t->gpus, H = t->groups;
    if (take(b, o[0], 0, n * G, 4, 0, "share_free", (void **)&q->share_free) ||
        take(b, o[1], 0, n * G, 8, 0, "gpu_model", (void **)&q->gpu_model) ||
        take(b, o[2], 0, n * G, 1, 1, "allowed", (void **)&q->allowed) ||
        take(b, o[3], 0, n * G, 8, 1, "gpu_memory_free", (void **)&q->gpu_memory_free) ||
        take(b, o[4], 0, n, 8, 0, "total", (void **)&q->total) ||
        take(b, o[5], 0, n, 8, 0, "cpu_free", (void **)&q->cpu_free) ||
        take(b, o[6], 0, n * H, 8, 0, "count", (void **)&q->count) ||
        take(b, o[7], 0, n * H, 8, 0, "usable", (void **)&q->usable) ||
        take(b, o[8], 0, n, 8, 1, "before_fgd", (void **)&q->before_fgd) ||
        take(b, o[9], 0, n, 8, 1, "before_capped", (void **)&q->before_capped))
        return -1;
    if (q->kind < 0 || q->kind > 2) {
        PyErr_SetString(PyExc_ValueError, "kernel: unknown request kind");
        return -1;
    }
    return 0;
}

/* growth(tables, kind, milli, gpu_count, cpu_milli, gpu_memory, share_free (N,G) int32, gpu_model (N,G) int64,
 *        allowed (N,G) bool | None, gpu_memory_free (N,G) int64 | None, total (N,) int64, cpu_free (N,) int64,
 *        count (N,H) int64, usable (N,H) int64, before_fgd (N,) f64 | None, before_capped (N,) f64 | None,
 *        rows (R,) int64, out_fgd f64 | None, out_capped f64 | None) -> None
 * Growth of each row's fragmentation if the request went there, rounded as ``growth.growth_rows``: a share
 * (kind 2) writes (R,G) (+inf on GPUs it does not fit), other kinds (R,). */
static PyObject *growth(PyObject *self, PyObject *args) {
    PyObject *capsule, *o[13];
    Growth q = {0};
    long long milli, gpu_count, cpu_milli, gpu_memory;
    if (!PyArg_ParseTuple(args, "OiLLLLOOOOOOOOOOOOO", &capsule, &q.kind, &milli, &gpu_count, &cpu_milli, &gpu_memory,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    q.milli = milli; q.gpu_count = gpu_count; q.cpu_milli = cpu_milli; q.gpu_memory = gpu_memory;
    Tables *t = tables_of(capsule);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyObject_Length(o[4]), r = PyObject_Length(o[10]);
    if (n < 0 || r < 0) return NULL;
    Py_ssize_t width = q.kind == KIND_SHARE ? t->gpus : 1;
    Buffers b = {.used = 0};
    int64_t *rows;
    double *out_fgd, *out_capped;
    if (growth_inputs(&b, t, o, n, &q) ||
        take(&b, o[10], 0, r, 8, 0, "rows", (void **)&rows) ||
        take(&b, o[11], 1, r * width, 8, 1, "out_fgd", (void **)&out_fgd) ||
        take(&b, o[12], 1, r * width, 8, 1, "out_capped", (void **)&out_capped)) {
        release_all(&b);
        return NULL;
    }
    if ((out_fgd && !q.before_fgd) || (out_capped && !q.before_capped)) {
        release_all(&b);
        PyErr_SetString(PyExc_ValueError, "kernel: a measure's output needs its fragmentation before");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < r; i++) {
        if (rows[i] < 0 || rows[i] >= n) {
            release_all(&b);
            PyErr_SetString(PyExc_IndexError, "kernel: row out of range");
            return NULL;
        }
        row_growth(t, &q, rows[i], out_fgd ? out_fgd + i * width : NULL, out_capped ? out_capped + i * width : NULL);
    }
    release_all(&b);
    Py_RETURN_NONE;
}

/* How a node's best score comes from its growth (``fgd.best_fgd_score``, ``FragAwarePolicy._best``). */
typedef struct {
    double max_score, step, scale, clip;
} Derive;

/* The best per-GPU score of one node and its first GPU among equals: trunc(max / (1 + exp((growth + cost) /
 * 1000))) - scale * floor(clip(capped) / step) (no secondary without ``capped``), -inf where infinite. */
static inline void row_best(const Derive *d, const double *growth, const double *capped, Py_ssize_t width,
                            double cost, double *value, int64_t *gpu) {
    double top = 0.0;
    int64_t at = -1;
    for (Py_ssize_t g = 0; g < width; g++) {
        if (g > 0 && growth[g] == growth[g - 1] && (!capped || capped[g] == capped[g - 1]))
            continue; /* a GPU alike to the one before (a node's free GPUs): the same score, never above it */
        double x = growth[g] + cost, score;
        if (isinf(x)) {
            score = -INFINITY;
        } else {
            score = trunc(d->max_score / (1.0 + exp(x / 1000.0)));
            if (capped) {
                double c = capped[g];
                c = c < -d->clip ? -d->clip : (c > d->clip ? d->clip : c);
                if (d->step > 0) c = floor(c / d->step);
                score -= d->scale * c;
            }
        }
        if (at < 0 || score > top) { top = score; at = g; }
    }
    *value = top;
    *gpu = at;
}

/* best(growth (R,W) f64, capped (R,W) f64 | None, max_score, step, scale, clip, values (R,) f64 out,
 *      gpu (R,) int64 out) -> None
 * Each row's best score and its first GPU among equals (``fgd.best_per_node``), see ``row_best``. */
static PyObject *best(PyObject *self, PyObject *args) {
    PyObject *o[4];
    Derive d;
    Py_ssize_t rows, width;
    if (!PyArg_ParseTuple(args, "nnOOddddOO", &rows, &width, &o[0], &o[1], &d.max_score, &d.step, &d.scale, &d.clip,
                          &o[2], &o[3]))
        return NULL;
    Buffers b = {.used = 0};
    double *growth, *capped, *values;
    int64_t *gpu;
    if (take(&b, o[0], 0, rows * width, 8, 0, "growth", (void **)&growth) ||
        take(&b, o[1], 0, rows * width, 8, 1, "capped", (void **)&capped) ||
        take(&b, o[2], 1, rows, 8, 0, "values", (void **)&values) ||
        take(&b, o[3], 1, rows, 8, 0, "gpu", (void **)&gpu)) {
        release_all(&b);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < rows; i++)
        row_best(&d, growth + i * width, capped ? capped + i * width : NULL, width, 0.0, values + i, gpu + i);
    release_all(&b);
    Py_RETURN_NONE;
}

/* The growth of the GPU milli a node's free memory can no longer serve at ``ratio`` MiB per milli if a
 * request of ``gpu_milli`` and ``asked`` (its memory / ratio) went there: max(gpu - g - (memory - asked), 0)
 * - max(gpu - memory, 0), memory = free MiB / ratio, the same operations in the same order as numpy's. */
static inline double memory_growth(int64_t total, int64_t memory_free, double ratio, double asked, int64_t gpu_milli) {
    double gpu = (double)total, memory = (double)memory_free / ratio;
    double before = gpu - memory, after = gpu - (double)gpu_milli - (memory - asked);
    before = before > 0.0 ? before : 0.0;
    after = after > 0.0 ? after : 0.0;
    return after - before;
}

/* memory_cost(total (N,) int64, memory_free (N,) int64, nodes (R,) int64, ratio, gpu_milli, memory_mib, weight,
 *             out (R,) f64) -> bool
 * ``FragAwarePolicy._memory_cost``: weight x the growth of the GPU milli each node's free memory can no longer
 * serve at ``ratio`` MiB per milli, max(gpu - g - (memory - m / ratio), 0) - max(gpu - memory, 0) with
 * memory = free MiB / ratio; returns whether it is nonzero anywhere. */
static PyObject *memory_cost(PyObject *self, PyObject *args) {
    PyObject *o[4];
    double ratio, weight;
    long long gpu_milli, memory_mib;
    if (!PyArg_ParseTuple(args, "OOOdLLdO", &o[0], &o[1], &o[2], &ratio, &gpu_milli, &memory_mib, &weight, &o[3]))
        return NULL;
    Py_ssize_t n = PyObject_Length(o[0]), r = PyObject_Length(o[2]);
    if (n < 0 || r < 0) return NULL;
    Buffers b = {.used = 0};
    int64_t *total, *memory_free, *nodes;
    double *out;
    if (take(&b, o[0], 0, n, 8, 0, "total", (void **)&total) ||
        take(&b, o[1], 0, n, 8, 0, "memory_free", (void **)&memory_free) ||
        take(&b, o[2], 0, r, 8, 0, "nodes", (void **)&nodes) ||
        take(&b, o[3], 1, r, 8, 0, "out", (void **)&out)) {
        release_all(&b);
        return NULL;
    }
    int any = 0;
    double asked = (double)memory_mib / ratio;
    for (Py_ssize_t i = 0; i < r; i++) {
        int64_t row = nodes[i];
        if (row < 0 || row >= n) { release_all(&b); PyErr_SetString(PyExc_IndexError, "kernel: node out of range"); return NULL; }
        double growth = memory_growth(total[row], memory_free[row], ratio, asked, gpu_milli);
        any |= growth != 0.0;
        out[i] = weight * growth;
    }
    release_all(&b);
    if (any) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* Nodes already computed in one pass, by their GPUs' models and free milli and their free CPU class before
 * and after the request: nodes alike in all of these have the same growth (``RowState.classes``), so a
 * shape's first use over thousands of nodes computes each such kind of node once (from ``dedupe_from`` stale
 * nodes on). Open addressing on a hash; a hit is compared in full. A slot is 16 bytes and the table is sized for
 * the kinds of node met, not for the nodes (a cluster of 10,000 has a thousand kinds or so): it starts small
 * enough to stay in the CPU's cache and doubles when half full. Its memory is kept between calls (the module's,
 * one decision at a time under the GIL). */
typedef struct {
    uint32_t tag;   /* the hash's high half */
    int32_t row;    /* the row kept + 1 (0: an empty slot) */
    int32_t before, after; /* the free CPU class before and after the request */
} SeenSlot;

typedef struct {
    SeenSlot *slots;
    size_t mask, count;
    const int32_t *share_free;
    const int64_t *gpu_model;
    Py_ssize_t gpus;
} Seen;

enum { SEEN_FIRST = 4096 }; /* slots to start with: 64 KiB */
static SeenSlot *seen_store = NULL;
static size_t seen_capacity = 0;

/* A store of ``capacity`` slots at least (the module's, kept); NULL: no memory. */
static SeenSlot *seen_reserve(size_t capacity) {
    if (capacity > seen_capacity) {
        SeenSlot *grown = malloc(capacity * sizeof(SeenSlot));
        if (grown == NULL) return NULL;
        free(seen_store);
        seen_store = grown; seen_capacity = capacity;
    }
    return seen_store;
}

/* Ready for a pass; -1 (no memory: nothing changed) or 0. */
static int seen_init(Seen *s, Py_ssize_t n, const int32_t *share_free, const int64_t *gpu_model, Py_ssize_t gpus) {
    size_t capacity = 64;
    while (capacity < (size_t)n * 2 && capacity < SEEN_FIRST) capacity <<= 1;
    if (seen_reserve(capacity) == NULL) return -1;
    memset(seen_store, 0, capacity * sizeof(SeenSlot));
    s->slots = seen_store;
    s->mask = capacity - 1;
    s->count = 0;
    s->share_free = share_free; s->gpu_model = gpu_model; s->gpus = gpus;
    return 0;
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    return h * 0xBF58476D1CE4E5B9ULL;
}

static inline uint64_t seen_hash(const Seen *s, int64_t row, int64_t before, int64_t after) {
    Py_ssize_t G = s->gpus;
    const int32_t *free_milli = s->share_free + row * G;
    const int64_t *model = s->gpu_model + row * G;
    uint64_t h = mix(mix(0x632BE59BD9B4E019ULL, (uint64_t)before), (uint64_t)after);
    for (Py_ssize_t g = 0; g < G; g++) h = mix(h, ((uint64_t)(uint32_t)free_milli[g] << 20) ^ (uint64_t)model[g]);
    return h ^ (h >> 31);
}

/* The table twice as large, its slots placed again; -1 (no memory: the table as it was) or 0. */
static int seen_grow(Seen *s) {
    size_t capacity = (s->mask + 1) * 2;
    SeenSlot *grown = malloc(capacity * sizeof(SeenSlot));
    if (grown == NULL) return -1;
    memset(grown, 0, capacity * sizeof(SeenSlot));
    for (size_t i = 0; i <= s->mask; i++) {
        SeenSlot slot = s->slots[i];
        if (slot.row == 0) continue;
        uint64_t h = seen_hash(s, slot.row - 1, slot.before, slot.after);
        size_t j = (size_t)h & (capacity - 1);
        while (grown[j].row != 0) j = (j + 1) & (capacity - 1);
        grown[j] = slot;
    }
    free(seen_store);
    seen_store = grown; seen_capacity = capacity;
    s->slots = grown;
    s->mask = capacity - 1;
    return 0;
}

/* The row kept as alike to ``row``, or -1 after keeping ``row`` (or when the table could not grow to keep it:
 * the row is then computed, as any other). */
static int64_t seen_find(Seen *s, int64_t row, int64_t before, int64_t after) {
    Py_ssize_t G = s->gpus;
    const int32_t *free_milli = s->share_free + row * G;
    const int64_t *model = s->gpu_model + row * G;
    if (before > INT32_MAX || after > INT32_MAX) return -1; /* classes a slot cannot hold: computed */
    uint64_t h = seen_hash(s, row, before, after);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & s->mask;; i = (i + 1) & s->mask) {
        SeenSlot *slot = s->slots + i;
        if (slot->row == 0) {
            if ((s->count + 1) * 2 > s->mask + 1) {
                if (seen_grow(s) < 0) return -1;
                return seen_find(s, row, before, after); /* placed in the grown table */
            }
            slot->tag = tag; slot->row = (int32_t)(row + 1); slot->before = (int32_t)before;
            slot->after = (int32_t)after;
            s->count++;
            return -1;
        }
        if (slot->tag == tag && slot->before == before && slot->after == after) {
            int64_t other = slot->row - 1;
            if (memcmp(free_milli, s->share_free + other * G, (size_t)G * sizeof(int32_t)) == 0 &&
                memcmp(model, s->gpu_model + other * G, (size_t)G * sizeof(int64_t)) == 0)
                return other;
        }
    }
}

/* Whether node ``row`` passes every check for the request (``feasibility.feasible_mask``, not for MIG). */
static inline int feasible(const Tables *t, const Growth *q, int64_t memory_mib, const int64_t *memory_free,
                           const uint8_t *extra, const int32_t *full_free, const int32_t *max_free, int64_t row) {
    Py_ssize_t G = t->gpus;
    if (extra && !extra[row]) return 0;
    if (q->cpu_milli && q->cpu_free[row] < q->cpu_milli) return 0;
    if (memory_mib && memory_free[row] < memory_mib) return 0;
    if (!q->allowed) { /* the node's summaries tell (``snapshot.full_free_count``, ``max_share_free``) */
        if (q->kind == KIND_WHOLE) return full_free[row] >= q->gpu_count;
        if (q->kind == KIND_SHARE && !(q->gpu_memory && q->gpu_memory_free)) return max_free[row] >= q->milli;
    }
    const int32_t *free_milli = q->share_free + row * G;
    const uint8_t *allowed = q->allowed ? q->allowed + row * G : NULL;
    if (q->kind == KIND_WHOLE) {
        int64_t full = 0;
        for (Py_ssize_t g = 0; g < G; g++) full += free_milli[g] == MILLI_PER_GPU && (!allowed || allowed[g]);
        return full >= q->gpu_count;
    }
    if (q->kind == KIND_SHARE) {
        for (Py_ssize_t g = 0; g < G; g++) {
            int64_t f = (allowed && !allowed[g]) ? 0 : free_milli[g];
            if (f >= q->milli && (!q->gpu_memory || !q->gpu_memory_free || q->gpu_memory_free[row * G + g] >= q->gpu_memory))
                return 1;
        }
        return 0;
    }
    return 1;
}

/* Scarcity (``FragAwarePolicy``, ``scarcity.class_excess``): a tuple (pressure (K,) f64, counts (K,) f64, class_free
 * (K,) int64 (the free share-usable GPU milli of each class, kept in step), usable (K,) uint8 (the classes an empty
 * node of which fits the request), node_class (N,) int64, slack, weight, max_pressure). */
typedef struct {
    double *pressure, *counts;
    int64_t *class_free, *node_class;
    uint8_t *usable;
    double slack, weight, max_pressure;
    Py_ssize_t classes;
} Scarcity;

static int scarcity_take(Buffers *b, PyObject *args, Py_ssize_t n, Scarcity *sc) {
    PyObject *o[5];
    if (!PyArg_ParseTuple(args, "OOOOOddd", &o[0], &o[1], &o[2], &o[3], &o[4], &sc->slack, &sc->weight,
                          &sc->max_pressure))
        return -1;
    if ((sc->classes = PyObject_Length(o[0])) < 0) return -1;
    Py_ssize_t k = sc->classes;
    return take(b, o[0], 0, k, 8, 0, "pressure", (void **)&sc->pressure) ||
           take(b, o[1], 0, k, 8, 0, "counts", (void **)&sc->counts) ||
           take(b, o[2], 1, k, 8, 0, "class_free", (void **)&sc->class_free) ||
           take(b, o[3], 0, k, 1, 0, "usable", (void **)&sc->usable) ||
           take(b, o[4], 0, n, 8, 0, "node_class", (void **)&sc->node_class) ? -1 : 0;
}

/* Each class's weighted scarcity cost for a request of ``gpu_milli`` into ``cost`` (K + 1: the last, no GPU, is 0);
 * 0 where it is 0 for every class. The operations of ``class_excess`` and ``FragAwarePolicy._class_cost``, in
 * their order: tightness p * c * 1000 * still_free / max(free, 1), what exceeds the least tight usable class (and
 * the slack), min(that, max_pressure) * milli, times the weight. */
static int scarcity_costs(const Scarcity *sc, long long gpu_milli, double *cost) {
    Py_ssize_t k = sc->classes;
    if (gpu_milli == 0) return 0;
    double count_sum = 0.0, free_sum = 0.0;
    for (Py_ssize_t i = 0; i < k; i++) count_sum += sc->counts[i];
    double capacity = count_sum * MILLI_PER_GPU;
    if (capacity <= 0) return 0;
    for (Py_ssize_t i = 0; i < k; i++) free_sum += (double)sc->class_free[i];
    double still_free = free_sum / capacity, top = 0.0, least = 0.0;
    int any_usable = 0;
    for (Py_ssize_t i = 0; i < k; i++) { /* the tightness, kept in ``cost`` for now */
        double f = (double)sc->class_free[i];
        cost[i] = sc->pressure[i] * sc->counts[i] * MILLI_PER_GPU * still_free / (f < 1.0 ? 1.0 : f);
        if (i == 0 || cost[i] > top) top = cost[i];
        if (sc->usable[i] && (!any_usable || cost[i] < least)) { least = cost[i]; any_usable = 1; }
    }
    if (k == 0 || top <= sc->slack || !any_usable) return 0;
    if (least < sc->slack) least = sc->slack;
    int any = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        double excess = sc->usable[i] && cost[i] - least > 0.0 ? cost[i] - least : 0.0;
        any |= excess != 0.0;
        cost[i] = sc->weight * ((excess < sc->max_pressure ? excess : sc->max_pressure) * (double)gpu_milli);
    }
    cost[k] = sc->weight * (0.0 * (double)gpu_milli);
    return any;
}

/* choose(memo, entry, snapshot, call) -> (feasible, row, gpu, value, ties, changed), four tuples (``kernel.choose``
 * keeps the first two between decisions):
 *   memo: (tables, gpu_model (N,G) int64, count (N,H) int64, usable, before_fgd (N,) f64, before_capped | None,
 *          row_version (N,) int64, values (N,) f64 out, gpus (N,) int64 out, tied (N,) int64 out, max_score, step,
 *          scale, clip, secondary, dedupe_from);
 *   entry (a request shape's memo): (kind, milli, gpu_count, cpu_milli, gpu_memory, gpu_milli_total, allowed (N,G)
 *          bool | None, entry_version (N,) int64 (updated), entry_fgd, entry_capped | None (updated: (N,G) for a
 *          share, else (N,)), derived_values (N,) f64, derived_gpu (N,) int64 (updated));
 *   snapshot: (share_free (N,G) int32, total (N,) int64, cpu_free (N,) int64, memory_free (N,) int64,
 *          full_free_count (N,) int32, max_share_free (N,) int32);
 *   call: (memory_mib, gpu_memory_free (N,G) int64 | None, extra (N,) bool | None, scarcity | None, step | None,
 *          ratio, memory_weight, want_ties).
 * One decision of a memoised policy in one pass: the node state stepped to the snapshot (``step``, see ``StepIn``),
 * each class's scarcity cost (``Scarcity``), the nodes that pass every check; on those whose state moved since
 * the memo last saw them, the growth and best score again (written into the memo); each one's score with the
 * scarcity cost of its class and its memory cost when they are not 0; the best, its GPU, how many nodes tie with
 * it and how many passed; when ``want_ties``, the tied rows in ``tied`` (node order) and each candidate's score
 * and GPU in ``values`` and ``gpus``; and how many nodes the step changed. */
static PyObject *choose(PyObject *self, PyObject *args) {
    PyObject *capsule, *o[29];
    Growth q = {0};
    Derive d;
    long long milli, gpu_count, cpu_milli, gpu_memory, memory_mib, gpu_milli_total;
    double ratio, memory_weight;
    int secondary, want_ties;
    Py_ssize_t dedupe_from;
    PyObject *memo_part, *entry_part, *snapshot_part, *call_part;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyTuple_Type, &memo_part, &PyTuple_Type, &entry_part, &PyTuple_Type,
                          &snapshot_part, &PyTuple_Type, &call_part) ||
        !PyArg_ParseTuple(memo_part, "OOOOOOOOOOddddpn", &capsule, &o[1], &o[6], &o[7], &o[8], &o[9], &o[12], &o[20],
                          &o[21], &o[22], &d.max_score, &d.step, &d.scale, &d.clip, &secondary, &dedupe_from) ||
        !PyArg_ParseTuple(entry_part, "iLLLLLOOOOOO", &q.kind, &milli, &gpu_count, &cpu_milli, &gpu_memory,
                          &gpu_milli_total, &o[2], &o[13], &o[14], &o[15], &o[16], &o[17]) ||
        !PyArg_ParseTuple(snapshot_part, "OOOOOO", &o[0], &o[4], &o[5], &o[10], &o[23], &o[24]) ||
        !PyArg_ParseTuple(call_part, "LOOOOddp", &memory_mib, &o[3], &o[11], &o[18], &o[19], &ratio, &memory_weight,
                          &want_ties))
        return NULL;
    q.milli = milli; q.gpu_count = gpu_count; q.cpu_milli = cpu_milli; q.gpu_memory = gpu_memory;
    Tables *t = tables_of(capsule);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyObject_Length(o[4]);
    if (n < 0) return NULL;
    Py_ssize_t width = q.kind == KIND_SHARE ? t->gpus : 1;
    Buffers b = {.used = 0};
    int64_t *memory_free, *row_version, *entry_version, *derived_gpu, *node_class = NULL, *gpus, *tied;
    int32_t *full_free, *max_free;
    uint8_t *extra;
    double *entry_fgd, *entry_capped, *derived_values, *class_cost = NULL, *values;
    Py_ssize_t classes = 0;
    StepIn st;
    Py_ssize_t changed = 0;
    Scarcity sc;
    if (o[19] != Py_None && !PyTuple_Check(o[19])) { PyErr_SetString(PyExc_TypeError, "kernel: step is a tuple"); return NULL; }
    if (o[18] != Py_None && !PyTuple_Check(o[18])) { PyErr_SetString(PyExc_TypeError, "kernel: scarcity is a tuple"); return NULL; }
    if ((o[19] != Py_None && step_take(&b, t, o[19], n, &st)) ||
        (o[18] != Py_None && scarcity_take(&b, o[18], n, &sc))) {
        release_all(&b);
        return NULL;
    }
    if (o[19] != Py_None) { /* the nodes that changed since the memo's last snapshot, first */
        if (st.class_free && (o[18] == Py_None || st.class_free != sc.class_free || st.classes != sc.classes)) {
            release_all(&b);
            PyErr_SetString(PyExc_ValueError, "kernel: the free GPU per class stepped is the scarcity's");
            return NULL;
        }
        if ((changed = step_run(t, &st, n)) < 0) { release_all(&b); return NULL; }
    }
    double cost_buffer[64], *cost_heap = NULL;
    if (o[18] != Py_None) { /* each class's scarcity cost, or none where it is 0 everywhere */
        classes = sc.classes + 1;
        class_cost = classes <= 64 ? cost_buffer : (cost_heap = malloc((size_t)classes * sizeof(double)));
        if (class_cost == NULL) { release_all(&b); return PyErr_NoMemory(); }
        if (!scarcity_costs(&sc, gpu_milli_total, class_cost)) class_cost = NULL;
        node_class = sc.node_class;
    }
    if (growth_inputs(&b, t, o, n, &q) ||
        take(&b, o[10], 0, n, 8, 0, "memory_free", (void **)&memory_free) ||
        take(&b, o[11], 0, n, 1, 1, "extra", (void **)&extra) ||
        take(&b, o[12], 0, n, 8, 0, "row_version", (void **)&row_version) ||
        take(&b, o[13], 1, n, 8, 0, "entry_version", (void **)&entry_version) ||
        take(&b, o[14], 1, n * width, 8, 1, "entry_fgd", (void **)&entry_fgd) ||
        take(&b, o[15], 1, n * width, 8, 1, "entry_capped", (void **)&entry_capped) ||
        take(&b, o[16], 1, n, 8, 0, "derived_values", (void **)&derived_values) ||
        take(&b, o[17], 1, n, 8, 0, "derived_gpu", (void **)&derived_gpu) ||
        take(&b, o[23], 0, n, 4, 0, "full_free_count", (void **)&full_free) ||
        take(&b, o[24], 0, n, 4, 0, "max_share_free", (void **)&max_free) ||

        take(&b, o[20], 1, n, 8, 0, "values", (void **)&values) ||
        take(&b, o[21], 1, n, 8, 0, "gpus", (void **)&gpus) ||
        take(&b, o[22], 1, n, 8, 0, "tied", (void **)&tied)) {
        release_all(&b);
        free(cost_heap);
        return NULL;
    }
    if (!entry_fgd || !q.before_fgd || (entry_capped && !q.before_capped) || (class_cost && !node_class)) {
        release_all(&b);
        free(cost_heap);
        PyErr_SetString(PyExc_ValueError, "kernel: choose needs the fgd growth and its inputs");
        return NULL;
    }
    const double *secondary_of = NULL; /* the capped growth orders FGD's ties (ours), or nothing (fgd) */
    Seen seen = {0};
    Py_ssize_t stale = 0;
    int with_memory = ratio > 0 && memory_weight != 0 && memory_mib > 0;
    double asked = with_memory ? (double)memory_mib / ratio : 0.0;
    /* A node whose free memory serves its free GPU milli and what the request asks beyond its GPU milli, with a
     * milli to spare, has no memory growth (both sides of ``memory_growth`` are 0): told by a multiplication,
     * not the division per node (a third of a pass over 10,000 nodes). The spare milli is far above the
     * rounding of the division at any magnitude the test admits (``plain_below``). */
    double beyond = asked - (double)gpu_milli_total > 0.0 ? asked - (double)gpu_milli_total : 0.0;
    double plain_below = 1e15, scale_up = ratio * (1.0 + 1e-9);
    int skip_memory = with_memory && asked < 1e12 && ratio >= 1e-6;
    Py_ssize_t passed = 0, ties = 0;
    int64_t best_row = -1, best_gpu = 0;
    double top = -INFINITY;
    /* The nodes that pass every check, in node order, into ``tied`` (read back below before any is written):
     * without a model mask or GPU memory asked, the checks are a few comparisons on per-node summaries, done
     * without a branch per node (the outcomes are data: a branch per node mispredicts). */
    int64_t *candidate = tied;
    Py_ssize_t m = 0;
    int64_t cpu_floor = cpu_milli ? cpu_milli : INT64_MIN, memory_floor = memory_mib ? memory_mib : INT64_MIN;
    int64_t gpu_asked = q.kind == KIND_WHOLE ? q.gpu_count : q.kind == KIND_SHARE ? q.milli : INT32_MIN;
    int32_t gpu_floor = (int32_t)(gpu_asked > INT32_MAX ? INT32_MAX : gpu_asked < INT32_MIN ? INT32_MIN : gpu_asked);
    const int32_t *summary = q.kind == KIND_WHOLE ? full_free : max_free;
    if (!q.allowed && !(q.kind == KIND_SHARE && q.gpu_memory && q.gpu_memory_free)) {
        for (int64_t row = 0; row < n; row++) {
            candidate[m] = row;
            m += (q.cpu_free[row] >= cpu_floor) & (memory_free[row] >= memory_floor) & (summary[row] >= gpu_floor) &
                 (extra ? extra[row] != 0 : 1);
        }
    } else { /* GPUs told apart by model or memory: the summaries rule nodes out (a model mask or GPU memory only
              * takes GPUs away), the rest are checked GPU by GPU */
        for (int64_t row = 0; row < n; row++)
            if (summary[row] >= gpu_floor &&
                feasible(t, &q, memory_mib, memory_free, extra, full_free, max_free, row)) candidate[m++] = row;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t row = candidate[i];
        passed++;
        double *fg = entry_fgd + row * width, *cg = entry_capped ? entry_capped + row * width : NULL;
        secondary_of = secondary ? cg : NULL;
        if (entry_version[row] != row_version[row]) {
            int64_t like = -1;
            if (++stale > dedupe_from && !q.gpu_memory && seen.slots == NULL && n < INT32_MAX &&
                seen_init(&seen, m, q.share_free, q.gpu_model, t->gpus) < 0) {
                release_all(&b);
                free(cost_heap);
                return PyErr_NoMemory(); /* seen.slots is NULL here */
            }
            if (seen.slots)
                like = seen_find(&seen, row, cpu_class(t, q.cpu_free[row]), cpu_class(t, q.cpu_free[row] - q.cpu_milli));
            if (like >= 0) { /* a node in the same state, computed in this pass: the same growth */
                memcpy(fg, entry_fgd + like * width, (size_t)width * sizeof(double));
                if (cg) memcpy(cg, entry_capped + like * width, (size_t)width * sizeof(double));
                derived_values[row] = derived_values[like];
                derived_gpu[row] = derived_gpu[like];
            } else {
                row_growth(t, &q, row, fg, cg);
                row_best(&d, fg, secondary_of, width, 0.0, derived_values + row, derived_gpu + row);
            }
            entry_version[row] = row_version[row];
        }
        double cost = 0.0;
        int costed = 0;
        if (class_cost) {
            int64_t k = node_class[row];
            if (k < 0 || k >= classes) {
                release_all(&b);
                free(cost_heap);
                PyErr_SetString(PyExc_IndexError, "kernel: node class out of range");
                return NULL;
            }
            cost = class_cost[k];
            costed = 1;
        }
        if (with_memory) {
            double spare = ((double)q.total[row] + beyond + 1.0) * scale_up;
            if (!(skip_memory && spare < plain_below && (double)memory_free[row] >= spare)) {
                double m = memory_weight * memory_growth(q.total[row], memory_free[row], ratio, asked, gpu_milli_total);
                cost = costed ? cost + m : m;
            } else if (!costed) {
                cost = memory_weight * 0.0;
            }
        }
        double value;
        int64_t gpu;
        if (cost != 0.0) {
            row_best(&d, fg, secondary_of, width, cost, &value, &gpu);
        } else {
            value = derived_values[row];
            gpu = derived_gpu[row];
        }
        if (isnan(value)) value = -INFINITY; /* a NaN score never wins */
        if (want_ties) { values[row] = value; gpus[row] = gpu; }
        if (best_row < 0 || value > top) {
            top = value; best_row = row; best_gpu = gpu; ties = 1;
        } else if (value == top) {
            ties++;
        }
    }
    if (ties > 1 && want_ties) { /* the tied rows, in node order (over the candidates, in place: k <= i) */
        Py_ssize_t k = 0;
        for (Py_ssize_t i = 0; i < m && k < ties; i++) {
            int64_t row = candidate[i];
            if (row >= best_row && values[row] == top) tied[k++] = row;
        }
    }
    release_all(&b);
    free(cost_heap);
    return Py_BuildValue("nLLdnn", passed, (long long)best_row, (long long)best_gpu, top, ties, changed);
}

static PyMethodDef methods[] = {
    {"choose", choose, METH_VARARGS, "One decision of a memoised policy in one pass."},
    {"memory_cost", memory_cost, METH_VARARGS, "Weighted growth of the GPU milli free memory cannot serve."},
    {"best", best, METH_VARARGS, "Each node's best score and GPU from its growth."},
    {"tables", make_tables, METH_VARARGS, "Copy a workload's group and shape tables (a capsule)."},
    {"stats", stats, METH_VARARGS, "Group figures, fragmentation and CPU class of some nodes."},
    {"step", step, METH_VARARGS, "The nodes that changed between two snapshots, their statistics again."},
    {"growth", growth, METH_VARARGS, "Fragmentation growth of some nodes if a request went there."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", "Fragmentation kernels (see kernel.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* the largest tables it takes (``kernel.supports``) */
    if (PyModule_AddIntConstant(m, "MAX_GPUS", MAX_GPUS) < 0 || PyModule_AddIntConstant(m, "MAX_GROUPS", MAX_GROUPS) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE", KERNEL_SOURCE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
