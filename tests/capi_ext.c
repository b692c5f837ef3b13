/* A tiny extension recording through mxprof's C API (tests/test_capi.py and
 * benchmarks/capi.py compile it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <time.h>

#include "mxprof_capi.h"

static const mxprof_capi *mxp;
static uint32_t outer, inner, frame, items, done;

static PyObject *init(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    const mxprof_capi *api = mxprof_capi_import();
    if (api == NULL) return NULL;
    mxp = api;
    int rc = 0;
    rc |= mxp->intern(MXPROF_CAPI_TASK, "native", "c_outer", &outer);
    rc |= mxp->intern(MXPROF_CAPI_EVENT, NULL, "c_inner", &inner);
    rc |= mxp->intern(MXPROF_CAPI_FRAME, "native", "c_frame", &frame);
    rc |= mxp->intern(MXPROF_CAPI_COUNTER, "native", "c_items", &items);
    rc |= mxp->intern(MXPROF_CAPI_MARKER, "native", "c_done", &done);
    return PyLong_FromLong(rc);
}

static void work(long n) {
    mxp->range_begin(outer);
    for (long i = 0; i < n; i++) {
        mxp->range_begin(inner);
        mxp->counter_add(items, 1);
        mxp->range_end(inner);
    }
    mxp->range_begin(frame);
    mxp->range_end(frame);
    mxp->range_end(outer);
    mxp->mark(done, MXPROF_CAPI_SCOPE_THREAD);
}

/* work(n): on the calling thread, with the GIL released. */
static PyObject *py_work(PyObject *self, PyObject *args) {
    (void)self;
    long n;
    if (!PyArg_ParseTuple(args, "l", &n)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    work(n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void *thread_main(void *arg) {
    work((long)(intptr_t)arg);
    return NULL;
}

/* threads(k, n): work(n) on k threads Python never saw. */
static PyObject *py_threads(PyObject *self, PyObject *args) {
    (void)self;
    long k, n;
    if (!PyArg_ParseTuple(args, "ll", &k, &n)) return NULL;
    if (k < 0 || k > 64) {
        PyErr_SetString(PyExc_ValueError, "threads: 0 to 64");
        return NULL;
    }
    pthread_t th[64];
    Py_BEGIN_ALLOW_THREADS
    for (long i = 0; i < k; i++) pthread_create(&th[i], NULL, thread_main, (void *)(intptr_t)n);
    for (long i = 0; i < k; i++) pthread_join(th[i], NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* misuse(): the codes of calls a native caller can get wrong. */
static PyObject *py_misuse(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    uint32_t id = 7;
    return Py_BuildValue(
        "(iiiiiiiiii)", mxp->intern(MXPROF_CAPI_TASK, "native", NULL, &id),
        mxp->intern(MXPROF_CAPI_TASK, NULL, "x", &id), mxp->intern(99, "native", "x", &id),
        mxp->intern(MXPROF_CAPI_TASK, "native", "x", NULL), mxp->range_begin(0xFFFFFFFFu),
        mxp->range_end(0xFFFFFFFFu), mxp->range_begin(items), mxp->counter_set(outer, 5),
        mxp->mark(items, MXPROF_CAPI_SCOPE_THREAD), mxp->mark(done, 42));
}

static PyObject *py_enabled(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyLong_FromLong(mxp->enabled());
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* bench(n): ns per range_begin + range_end pair, n pairs in a loop. */
static PyObject *py_bench(PyObject *self, PyObject *args) {
    (void)self;
    long n;
    if (!PyArg_ParseTuple(args, "l", &n)) return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "bench: n must be positive");
        return NULL;
    }
    int64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        mxp->range_begin(inner);
        mxp->range_end(inner);
    }
    return PyFloat_FromDouble((double)(now_ns() - t0) / (double)n);
}

static PyMethodDef methods[] = {
    {"init", init, METH_NOARGS, NULL},
    {"work", py_work, METH_VARARGS, NULL},
    {"threads", py_threads, METH_VARARGS, NULL},
    {"misuse", py_misuse, METH_NOARGS, NULL},
    {"enabled", py_enabled, METH_NOARGS, NULL},
    {"bench", py_bench, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "capi_ext", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_capi_ext(void) { return PyModule_Create(&module); }
