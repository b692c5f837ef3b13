/* A minimal NVTX tool (tests/test_nvtx.py): NVTX v3 loads it through
 * NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2, which fills the
 * domain functions' slots.  Every call is logged, one line each, to the file
 * named by MXPROF_NVTX_LOG:  <os tid> TAB <op> TAB <domain> TAB <text>; a
 * range's integer payload (a frame's index) follows its name after '#'. */
#define _GNU_SOURCE
#define NVTX_NO_IMPL
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nvToolsExt.h"

struct nvtxDomainRegistration_st {
    char *name;
};
struct nvtxStringRegistration_st {
    char *text;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static unsigned long long next_range = 1;

static void say(const char *op, nvtxDomainHandle_t d, const char *text) {
    pthread_mutex_lock(&lock);
    fprintf(out, "%ld\t%s\t%s\t%s\n", (long)syscall(SYS_gettid), op, d ? d->name : "-",
            text ? text : "");
    fflush(out);
    pthread_mutex_unlock(&lock);
}

static const char *message(const nvtxEventAttributes_t *a) {
    if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) return a->message.registered->text;
    if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) return a->message.ascii;
    return "?";
}

static nvtxDomainHandle_t domain_create(const char *name) {
    nvtxDomainHandle_t d = malloc(sizeof *d);
    d->name = strdup(name);
    say("domain", d, name);
    return d;
}

static nvtxStringHandle_t string_register(nvtxDomainHandle_t d, const char *text) {
    nvtxStringHandle_t s = malloc(sizeof *s);
    s->text = strdup(text);
    say("string", d, text);
    return s;
}

static int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    char text[512];
    if (a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64) {
        snprintf(text, sizeof text, "%s#%llu", message(a), (unsigned long long)a->payload.ullValue);
        say("push", d, text);
    } else {
        say("push", d, message(a));
    }
    return 0;
}

static int pop(nvtxDomainHandle_t d) {
    say("pop", d, NULL);
    return 0;
}

static void mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { say("mark", d, message(a)); }

static nvtxRangeId_t start(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    char text[512];
    pthread_mutex_lock(&lock);
    unsigned long long id = next_range++;
    pthread_mutex_unlock(&lock);
    snprintf(text, sizeof text, "%llu %s", id, message(a));
    say("start", d, text);
    return id;
}

static void end(nvtxDomainHandle_t d, nvtxRangeId_t id) {
    char text[32];
    snprintf(text, sizeof text, "%llu", (unsigned long long)id);
    say("end", d, text);
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    const char *path = getenv("MXPROF_NVTX_LOG");
    out = fopen(path ? path : "/dev/null", "a");
    if (out == NULL) return 0;
    const NvtxExportTableCallbacks *cb = get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable t;
    unsigned int n;
    if (cb == NULL || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) return 0;
    if (n <= NVTX_CBID_CORE2_DomainCreateA) return 0;
    *t[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
    *t[NVTX_CBID_CORE2_DomainRegisterStringA] = (NvtxFunctionPointer)string_register;
    *t[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
    *t[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
    *t[NVTX_CBID_CORE2_DomainMarkEx] = (NvtxFunctionPointer)mark;
    *t[NVTX_CBID_CORE2_DomainRangeStartEx] = (NvtxFunctionPointer)start;
    *t[NVTX_CBID_CORE2_DomainRangeEnd] = (NvtxFunctionPointer)end;
    return 1;
}
