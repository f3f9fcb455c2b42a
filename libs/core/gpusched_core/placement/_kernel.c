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

static inline double rounded(double growth) {
    /* numpy's ndarray.round(6) (multiply, rint, divide), then + 0.0: a zero is +0.0 */
    return rint(growth * 1e6) / 1e6 + 0.0;
}

typedef struct {
    Py_buffer views[16];
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
    int64_t free_milli[MAX_GPUS];
    for (Py_ssize_t i = 0; i < r; i++) {
        int64_t row = rows[i];
        if (row < 0 || row >= n) { release_all(&b); PyErr_SetString(PyExc_IndexError, "kernel: row out of range"); return NULL; }
        for (Py_ssize_t g = 0; g < G; g++) free_milli[g] = share_free[row * G + g];
        group_stats(t, free_milli, gpu_model + row * G, count + row * H, usable + row * H);
        double a, c;
        usable_sums(t, count + row * H, usable + row * H, cpu_free[row], &a, &c);
        if (fgd) fgd[row] = (double)total[row] - a;
        if (capped) capped[row] = (double)total[row] - c;
        klass[row] = cpu_class(t, cpu_free[row]);
    }
    release_all(&b);
    Py_RETURN_NONE;
}

enum { KIND_NONE = 0, KIND_WHOLE = 1, KIND_SHARE = 2 };

/* growth(tables, kind, milli, gpu_count, cpu_milli, gpu_memory, share_free (N,G) int32, gpu_model (N,G) int64,
 *        allowed (N,G) bool | None, gpu_memory_free (N,G) int64 | None, total (N,) int64, cpu_free (N,) int64,
 *        rows (R,) int64, count (N,H) int64, usable (N,H) int64, before_fgd (N,) f64 | None,
 *        before_capped (N,) f64 | None, out_fgd f64 | None, out_capped f64 | None) -> None
 * Growth of each row's fragmentation if the request went there, rounded as ``growth.growth_rows``: a share
 * (kind 2) writes (R,G) (+inf on GPUs it does not fit), other kinds (R,). */
static PyObject *growth(PyObject *self, PyObject *args) {
    PyObject *capsule, *o[13];
    int kind;
    long long milli, gpu_count, cpu_milli, gpu_memory;
    if (!PyArg_ParseTuple(args, "OiLLLLOOOOOOOOOOOOO", &capsule, &kind, &milli, &gpu_count, &cpu_milli, &gpu_memory,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    Tables *t = tables_of(capsule);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyObject_Length(o[4]), r = PyObject_Length(o[6]);
    if (n < 0 || r < 0) return NULL;
    Py_ssize_t G = t->gpus, H = t->groups, width = kind == KIND_SHARE ? G : 1;
    Buffers b = {.used = 0};
    int32_t *share_free; int64_t *gpu_model, *gpu_memory_free, *total, *cpu_free, *rows, *count, *usable;
    uint8_t *allowed; double *before_fgd, *before_capped, *out_fgd, *out_capped;
    if (take(&b, o[0], 0, n * G, 4, 0, "share_free", (void **)&share_free) ||
        take(&b, o[1], 0, n * G, 8, 0, "gpu_model", (void **)&gpu_model) ||
        take(&b, o[2], 0, n * G, 1, 1, "allowed", (void **)&allowed) ||
        take(&b, o[3], 0, n * G, 8, 1, "gpu_memory_free", (void **)&gpu_memory_free) ||
        take(&b, o[4], 0, n, 8, 0, "total", (void **)&total) ||
        take(&b, o[5], 0, n, 8, 0, "cpu_free", (void **)&cpu_free) ||
        take(&b, o[6], 0, r, 8, 0, "rows", (void **)&rows) ||
        take(&b, o[7], 0, n * H, 8, 0, "count", (void **)&count) ||
        take(&b, o[8], 0, n * H, 8, 0, "usable", (void **)&usable) ||
        take(&b, o[9], 0, n, 8, 1, "before_fgd", (void **)&before_fgd) ||
        take(&b, o[10], 0, n, 8, 1, "before_capped", (void **)&before_capped) ||
        take(&b, o[11], 1, r * width, 8, 1, "out_fgd", (void **)&out_fgd) ||
        take(&b, o[12], 1, r * width, 8, 1, "out_capped", (void **)&out_capped)) {
        release_all(&b);
        return NULL;
    }
    if ((out_fgd && !before_fgd) || (out_capped && !before_capped) || kind < 0 || kind > 2) {
        release_all(&b);
        PyErr_SetString(PyExc_ValueError, "kernel: a measure's output needs its fragmentation before");
        return NULL;
    }
    int64_t free_milli[MAX_GPUS], cnt[MAX_GROUPS], use[MAX_GROUPS];
    for (Py_ssize_t i = 0; i < r; i++) {
        int64_t row = rows[i];
        if (row < 0 || row >= n) { release_all(&b); PyErr_SetString(PyExc_IndexError, "kernel: row out of range"); return NULL; }
        const int64_t *model = gpu_model + row * G;
        const int64_t *row_count = count + row * H, *row_usable = usable + row * H;
        int64_t cpu_after = cpu_free[row] - cpu_milli;
        for (Py_ssize_t g = 0; g < G; g++) {
            int64_t f = share_free[row * G + g];
            free_milli[g] = (allowed && !allowed[row * G + g]) ? 0 : f; /* what the request may take */
        }
        double a, c;
        if (kind == KIND_SHARE) {
            for (Py_ssize_t g = 0; g < G; g++) {
                double *fg = out_fgd ? out_fgd + i * G + g : NULL, *cg = out_capped ? out_capped + i * G + g : NULL;
                int fits = free_milli[g] >= milli;
                if (fits && gpu_memory > 0 && gpu_memory_free) fits = gpu_memory_free[row * G + g] >= gpu_memory;
                if (!fits) {
                    if (fg) *fg = INFINITY;
                    if (cg) *cg = INFINITY;
                    continue;
                }
                int64_t old = share_free[row * G + g], left = old - milli;
                Py_ssize_t same = -1; /* an earlier GPU of the node in the same state gives the same growth */
                for (Py_ssize_t e = 0; e < g && same < 0 && gpu_memory == 0; e++) {
                    if (share_free[row * G + e] == old && model[e] == model[g] && free_milli[e] == free_milli[g])
                        same = e;
                }
                if (same >= 0) {
                    if (fg) *fg = out_fgd[i * G + same];
                    if (cg) *cg = out_capped[i * G + same];
                    continue;
                }
                const uint8_t *ok = t->group_ok + model[g] * H;
                for (Py_ssize_t h = 0; h < H; h++) {
                    int was = ok[h] && old >= t->group_milli[h], now = ok[h] && left >= t->group_milli[h];
                    cnt[h] = row_count[h] - was + now;
                    use[h] = row_usable[h] - old * was + left * now;
                }
                usable_sums(t, cnt, use, cpu_after, &a, &c);
                double after_total = (double)(total[row] - milli);
                if (fg) *fg = rounded(after_total - a - before_fgd[row]);
                if (cg) *cg = rounded(after_total - c - before_capped[row]);
            }
            continue;
        }
        int64_t after_total = total[row];
        const int64_t *stats_count = row_count, *stats_usable = row_usable;
        if (kind == KIND_WHOLE) {
            int64_t taken = 0, after_free[MAX_GPUS];
            for (Py_ssize_t g = 0; g < G; g++) {
                int64_t f = share_free[row * G + g];
                if (free_milli[g] == MILLI_PER_GPU && taken < gpu_count) { taken++; f = 0; }
                after_free[g] = f;
            }
            group_stats(t, after_free, model, cnt, use);
            after_total -= MILLI_PER_GPU * taken;
            stats_count = cnt; stats_usable = use;
        }
        usable_sums(t, stats_count, stats_usable, cpu_after, &a, &c);
        if (out_fgd) out_fgd[i] = rounded((double)after_total - a - before_fgd[row]);
        if (out_capped) out_capped[i] = rounded((double)after_total - c - before_capped[row]);
    }
    release_all(&b);
    Py_RETURN_NONE;
}

/* best(growth (R,W) f64, capped (R,W) f64 | None, max_score, step, scale, clip, values (R,) f64 out,
 *      gpu (R,) int64 out) -> None
 * Each row's best score and its first GPU among equals (``fgd.best_per_node``) of the per-GPU score
 * trunc(max_score / (1 + exp(growth / 1000))) - scale * floor(clip(capped) / step) (the division only
 * when step > 0; no secondary term without ``capped``), -inf where the growth is infinite. */
static PyObject *best(PyObject *self, PyObject *args) {
    PyObject *o[4];
    double max_score, step, scale, clip;
    Py_ssize_t rows, width;
    if (!PyArg_ParseTuple(args, "nnOOddddOO", &rows, &width, &o[0], &o[1], &max_score, &step, &scale, &clip, &o[2],
                          &o[3]))
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
    for (Py_ssize_t i = 0; i < rows; i++) {
        double top = 0.0;
        int64_t at = -1;
        for (Py_ssize_t g = 0; g < width; g++) {
            double x = growth[i * width + g], score;
            if (isinf(x)) {
                score = -INFINITY;
            } else {
                score = trunc(max_score / (1.0 + exp(x / 1000.0)));
                if (capped) {
                    double c = capped[i * width + g];
                    c = c < -clip ? -clip : (c > clip ? clip : c);
                    if (step > 0) c = floor(c / step);
                    score -= scale * c;
                }
            }
            if (at < 0 || score > top) { top = score; at = g; }
        }
        values[i] = top;
        gpu[i] = at;
    }
    release_all(&b);
    Py_RETURN_NONE;
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
        double gpu = (double)total[row], memory = (double)memory_free[row] / ratio;
        double before = gpu - memory, after = gpu - (double)gpu_milli - (memory - asked);
        before = before > 0.0 ? before : 0.0;
        after = after > 0.0 ? after : 0.0;
        double growth = after - before;
        any |= growth != 0.0;
        out[i] = weight * growth;
    }
    release_all(&b);
    if (any) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"memory_cost", memory_cost, METH_VARARGS, "Weighted growth of the GPU milli free memory cannot serve."},
    {"best", best, METH_VARARGS, "Each node's best score and GPU from its growth."},
    {"tables", make_tables, METH_VARARGS, "Copy a workload's group and shape tables (a capsule)."},
    {"stats", stats, METH_VARARGS, "Group figures, fragmentation and CPU class of some nodes."},
    {"growth", growth, METH_VARARGS, "Fragmentation growth of some nodes if a request went there."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", "Fragmentation kernels (see kernel.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&module); }
