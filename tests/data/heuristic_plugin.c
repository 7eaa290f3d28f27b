/* A heuristic plugin with the hipDNN heuristics RFC's C ABI (§8), for tests/test_native_policies.py.
 *
 * Policy "Test::Reverse": the candidates in reverse order, when the device properties and the serialized problem
 * were given (else NOT_INITIALIZED / not applied). Built with -D switches into the variants the loader must reject:
 *   -DAPI_VERSION='"2.0.0"'   another C ABI major
 *   -DPOLICY_NAME='"..."'     a name whose hash is not the id
 *   -DNO_FINALIZE             a required symbol missing
 *   -DNO_NAME                 the optional name left out (the id alone identifies it)
 *   -DDECLINE                 Finalize applies to nothing (out_applied = 0)
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef API_VERSION
#define API_VERSION "1.0.0"
#endif
#ifndef POLICY_NAME
#define POLICY_NAME "Test::Reverse"
#endif
#define EXPORT __attribute__((visibility("default")))

typedef enum {
    STATUS_SUCCESS = 0, STATUS_BAD_PARAM, STATUS_INVALID_VALUE, STATUS_INTERNAL_ERROR, STATUS_ALLOC_FAILED,
    STATUS_NOT_APPLICABLE, STATUS_NOT_INITIALIZED
} hipdnnPluginStatus_t;
typedef struct { const void* ptr; size_t size; } hipdnnPluginConstData_t;
typedef void (*hipdnnHeuristicLoggingCallback_t)(int severity, const char* prefix, const char* message);

typedef struct { size_t props_size; } Handle;
typedef struct { Handle* handle; int64_t* ids; size_t count; size_t graph_size; int finalized; } Descriptor;

static hipdnnHeuristicLoggingCallback_t g_log = NULL;
static const char* g_error = "";

/* FNV-1a 64 over the UTF-8 name, as a signed int64 (policyNameToId, the engine-id hash) */
static int64_t name_to_id(const char* s) {
    uint64_t h = 14695981039346656037ULL;
    for (; *s; ++s) { h ^= (unsigned char)*s; h *= 1099511628211ULL; }
    return (int64_t)h;
}

EXPORT hipdnnPluginStatus_t hipdnnHeuristicGetApiVersion(const char** v) {
    if (!v) return STATUS_BAD_PARAM;
    *v = API_VERSION;
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicGetPolicyId(int64_t* id) {
    if (!id) return STATUS_BAD_PARAM;
    *id = name_to_id("Test::Reverse");
    return STATUS_SUCCESS;
}
#ifndef NO_NAME
EXPORT hipdnnPluginStatus_t hipdnnHeuristicGetPolicyName(const char** n) {
    if (!n) return STATUS_BAD_PARAM;
    *n = POLICY_NAME;
    return STATUS_SUCCESS;
}
#endif
EXPORT hipdnnPluginStatus_t hipdnnHeuristicGetPluginVersion(const char** v) {
    if (!v) return STATUS_BAD_PARAM;
    *v = "0.1.0";
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicSetLoggingCallback(hipdnnHeuristicLoggingCallback_t cb) {
    g_log = cb;
    if (g_log) g_log(1, "[Test::Reverse] ", "logging callback installed");
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicSetLogLevel(int level) { (void)level; return STATUS_SUCCESS; }
EXPORT void hipdnnHeuristicGetLastErrorString(const char** e) { if (e) *e = g_error; }

EXPORT hipdnnPluginStatus_t hipdnnHeuristicHandleCreate(void** out) {
    if (!out) return STATUS_BAD_PARAM;
    *out = calloc(1, sizeof(Handle));
    return *out ? STATUS_SUCCESS : STATUS_ALLOC_FAILED;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicHandleDestroy(void* h) { free(h); return STATUS_SUCCESS; }
EXPORT hipdnnPluginStatus_t hipdnnHeuristicHandleSetDeviceProperties(void* h, const hipdnnPluginConstData_t* p) {
    if (!h || !p || !p->ptr || p->size == 0) { g_error = "empty device properties"; return STATUS_BAD_PARAM; }
    ((Handle*)h)->props_size = p->size;
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicyDescriptorCreate(void* h, void** out) {
    if (!h || !out) return STATUS_BAD_PARAM;
    Descriptor* d = calloc(1, sizeof(Descriptor));
    if (!d) return STATUS_ALLOC_FAILED;
    d->handle = (Handle*)h;
    *out = d;
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicyDescriptorDestroy(void* d) {
    if (d) free(((Descriptor*)d)->ids);
    free(d);
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicySetEngineIds(void* dv, const int64_t* ids, size_t n) {
    Descriptor* d = dv;
    if (!d || (n && !ids)) return STATUS_BAD_PARAM;
    free(d->ids);
    d->ids = malloc(n ? n * sizeof(int64_t) : 1);
    if (n) memcpy(d->ids, ids, n * sizeof(int64_t));
    d->count = n;
    d->finalized = 0;
    return STATUS_SUCCESS;
}
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicySetSerializedGraph(void* dv, const hipdnnPluginConstData_t* g) {
    Descriptor* d = dv;
    if (!d || !g) return STATUS_BAD_PARAM;
    d->graph_size = g->ptr ? g->size : 0;
    return STATUS_SUCCESS;
}
#ifndef NO_FINALIZE
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicyFinalize(void* dv, int32_t* applied) {
    Descriptor* d = dv;
    if (!d || !applied) return STATUS_BAD_PARAM;
    *applied = 0;
    if (!d->handle->props_size) { g_error = "device properties were not set"; return STATUS_NOT_INITIALIZED; }
#ifdef DECLINE
    return STATUS_SUCCESS;
#endif
    if (!d->graph_size || d->count == 0) return STATUS_SUCCESS;
    for (size_t i = 0; i < d->count / 2; ++i) {
        int64_t t = d->ids[i]; d->ids[i] = d->ids[d->count - 1 - i]; d->ids[d->count - 1 - i] = t;
    }
    d->finalized = 1;
    *applied = 1;
    return STATUS_SUCCESS;
}
#endif
EXPORT hipdnnPluginStatus_t hipdnnHeuristicPolicyGetSortedEngineIds(void* dv, int64_t* out, size_t capacity,
                                                                    size_t* count) {
    Descriptor* d = dv;
    if (!d || !count) return STATUS_BAD_PARAM;
    if (!d->finalized) { g_error = "not finalized"; return STATUS_NOT_INITIALIZED; }
    size_t n = d->count < capacity ? d->count : capacity; /* a prefix when the buffer is short: not an error */
    if (n && !out) return STATUS_BAD_PARAM;
    if (n) memcpy(out, d->ids, n * sizeof(int64_t));
    *count = n;
    return STATUS_SUCCESS;
}
