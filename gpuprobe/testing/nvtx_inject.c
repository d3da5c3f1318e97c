/*
 * NVTX injection library that records every NVTX call to a file.
 *
 * The NVTX runtime (compiled into the `nvtx` Python package, libtorch, ...)
 * reads NVTX_INJECTION64_PATH on the first NVTX call of a process, dlopens the
 * library it names and calls InitializeInjectionNvtx2().  This library fills the
 * CORE and CORE2 callback tables, so every push/pop/mark/range/domain/string/
 * category call lands here and is written, one JSON object per line, to the file
 * named by GPUPROBE_NVTX_CAPTURE_FILE.
 *
 * Each NVTX instance in a process (every shared object that compiled NVTX in)
 * calls InitializeInjectionNvtx2 on its own; all of them share this library's
 * state, so domain and string handles are valid across them.
 *
 * Line format (keys are omitted when they do not apply):
 *   {"kind":"push","ts":<CLOCK_MONOTONIC ns>,"pid":N,"tid":N,"domain":"name",
 *    "message":"...","message_type":"ascii|unicode|registered",
 *    "category":N,"category_name":"...","payload":V,"payload_type":"int64|...",
 *    "color":N,"depth":N,"id":N,"target":N,"version":N}
 * kinds: init, push, pop, mark, range_start, range_end, domain_create,
 *        domain_destroy, register_string, name_category, name_thread.
 * The default (NULL) domain is written as "".
 *
 * Build: gcc -shared -fPIC -O2 -pthread -I<dir containing nvtx3/> nvtx_inject.c
 */

#define _GNU_SOURCE
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))

/* Payload type of the payload extension (nvToolsExtPayload.h); the value is
 * part of the NVTX ABI.  The payload then points to `reserved0` entries of
 * {uint64_t schemaId; size_t size; const void* payload;}. */
#define GP_PAYLOAD_TYPE_EXT ((int32_t)0xDFBD0009)
typedef struct gp_payload_data {
    uint64_t schemaId;
    size_t size;
    const void* payload;
} gp_payload_data;

/* ------------------------------------------------------------------ */
/* Registries: domains, categories, registered strings                */
/* ------------------------------------------------------------------ */

typedef struct gp_category {
    uint32_t id;
    char* name;
    struct gp_category* next;
} gp_category;

typedef struct gp_domain {
    char* name;
    gp_category* categories; /* newest first; read lock-free */
    struct gp_domain* next;
} gp_domain;

typedef struct gp_string {
    gp_domain* domain;
    char* text;
} gp_string;

static gp_domain g_default_domain = {"", NULL, NULL};
static gp_domain* g_domains = NULL; /* named domains, guarded by g_registry_lock */
static pthread_mutex_t g_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_write_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_fd = -1;
static int g_open_errno = 0;
static pid_t g_pid = 0;
static uint64_t g_next_range_id = 0;

static __thread pid_t t_tid = 0;

static gp_domain* domain_of(nvtxDomainHandle_t handle)
{
    return handle ? (gp_domain*)handle : &g_default_domain;
}

static const char* category_name(const gp_domain* d, uint32_t id)
{
    const gp_category* c = __atomic_load_n(&d->categories, __ATOMIC_ACQUIRE);
    for (; c; c = c->next)
        if (c->id == id)
            return c->name;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Per-thread, per-domain push/pop depth                               */
/* ------------------------------------------------------------------ */

typedef struct gp_depth_slot {
    const void* domain;
    int depth;
} gp_depth_slot;

typedef struct gp_depths {
    int count;
    int capacity;
    gp_depth_slot slots[];
} gp_depths;

static __thread gp_depths* t_depths = NULL;
static pthread_key_t g_depth_key;

static void free_depths(void* p) { free(p); }

static int* depth_of(const void* domain)
{
    gp_depths* ds = t_depths;
    if (ds) {
        for (int i = 0; i < ds->count; ++i)
            if (ds->slots[i].domain == domain)
                return &ds->slots[i].depth;
    }
    if (!ds || ds->count == ds->capacity) {
        int capacity = ds ? ds->capacity * 2 : 8;
        gp_depths* grown = realloc(ds, sizeof(gp_depths) + (size_t)capacity * sizeof(gp_depth_slot));
        if (!grown)
            return NULL;
        if (!ds)
            grown->count = 0;
        grown->capacity = capacity;
        ds = grown;
        t_depths = ds;
        pthread_setspecific(g_depth_key, ds);
    }
    ds->slots[ds->count].domain = domain;
    ds->slots[ds->count].depth = 0;
    return &ds->slots[ds->count++].depth;
}

/* Returns the 0-based level of the range being started. */
static int depth_push(const void* domain)
{
    int* d = depth_of(domain);
    if (!d)
        return -1;
    return (*d)++;
}

/* Returns the level of the range being ended, or -1 when none is open. */
static int depth_pop(const void* domain)
{
    int* d = depth_of(domain);
    if (!d || *d <= 0)
        return -1;
    return --(*d);
}

/* ------------------------------------------------------------------ */
/* Line building                                                       */
/* ------------------------------------------------------------------ */

typedef struct gp_buf {
    char* data;
    size_t len;
    size_t cap;
    int failed;
    char local[1024];
} gp_buf;

static void buf_init(gp_buf* b)
{
    b->data = b->local;
    b->len = 0;
    b->cap = sizeof(b->local);
    b->failed = 0;
}

static void buf_free(gp_buf* b)
{
    if (b->data != b->local)
        free(b->data);
}

static int buf_reserve(gp_buf* b, size_t extra)
{
    if (b->failed)
        return 0;
    if (b->len + extra <= b->cap)
        return 1;
    size_t cap = b->cap * 2;
    while (cap < b->len + extra)
        cap *= 2;
    char* p;
    if (b->data == b->local) {
        p = malloc(cap);
        if (p)
            memcpy(p, b->local, b->len);
    } else {
        p = realloc(b->data, cap);
    }
    if (!p) {
        b->failed = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

static void buf_raw(gp_buf* b, const char* s, size_t n)
{
    if (!buf_reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void buf_lit(gp_buf* b, const char* s) { buf_raw(b, s, strlen(s)); }

static void buf_fmt(gp_buf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_fmt(gp_buf* b, const char* fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        buf_raw(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* JSON string from UTF-8 bytes (bytes >= 0x80 pass through). */
static void buf_json_str(gp_buf* b, const char* s)
{
    static const char hex[] = "0123456789abcdef";
    buf_raw(b, "\"", 1);
    if (s) {
        const unsigned char* p = (const unsigned char*)s;
        const unsigned char* run = p;
        for (; *p; ++p) {
            unsigned char c = *p;
            if (c >= 0x20 && c != '"' && c != '\\')
                continue;
            buf_raw(b, (const char*)run, (size_t)(p - run));
            switch (c) {
            case '"': buf_raw(b, "\\\"", 2); break;
            case '\\': buf_raw(b, "\\\\", 2); break;
            case '\n': buf_raw(b, "\\n", 2); break;
            case '\r': buf_raw(b, "\\r", 2); break;
            case '\t': buf_raw(b, "\\t", 2); break;
            default: {
                char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                buf_raw(b, esc, 6);
            }
            }
            run = p + 1;
        }
        buf_raw(b, (const char*)run, (size_t)(p - run));
    }
    buf_raw(b, "\"", 1);
}

static void buf_key(gp_buf* b, const char* key)
{
    buf_raw(b, ",\"", 2);
    buf_lit(b, key);
    buf_raw(b, "\":", 2);
}

static void buf_key_str(gp_buf* b, const char* key, const char* value)
{
    buf_key(b, key);
    buf_json_str(b, value);
}

static void buf_key_u64(gp_buf* b, const char* key, uint64_t v)
{
    buf_key(b, key);
    buf_fmt(b, "%llu", (unsigned long long)v);
}

static void buf_key_i64(gp_buf* b, const char* key, int64_t v)
{
    buf_key(b, key);
    buf_fmt(b, "%lld", (long long)v);
}

static void buf_key_double(gp_buf* b, const char* key, double v)
{
    buf_key(b, key);
    if (isnan(v))
        buf_lit(b, "NaN");
    else if (isinf(v))
        buf_lit(b, v > 0 ? "Infinity" : "-Infinity");
    else
        buf_fmt(b, "%.17g", v);
}

/* UTF-32 wchar_t string to a malloc'd UTF-8 string. */
static char* wide_to_utf8(const wchar_t* w)
{
    if (!w)
        return NULL;
    size_t n = wcslen(w);
    char* out = malloc(n * 4 + 1);
    if (!out)
        return NULL;
    char* o = out;
    for (size_t i = 0; i < n; ++i) {
        uint32_t c = (uint32_t)w[i];
        if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)
            c = 0xFFFD;
        if (c < 0x80) {
            *o++ = (char)c;
        } else if (c < 0x800) {
            *o++ = (char)(0xC0 | (c >> 6));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            *o++ = (char)(0xE0 | (c >> 12));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        } else {
            *o++ = (char)(0xF0 | (c >> 18));
            *o++ = (char)(0x80 | ((c >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *o++ = (char)(0x80 | (c & 0x3F));
        }
    }
    *o = '\0';
    return out;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pid_t current_tid(void)
{
    if (t_tid == 0)
        t_tid = (pid_t)syscall(SYS_gettid);
    return t_tid;
}

static void begin(gp_buf* b, const char* kind, const gp_domain* d, uint64_t ts)
{
    buf_init(b);
    buf_lit(b, "{\"kind\":\"");
    buf_lit(b, kind);
    buf_lit(b, "\"");
    buf_key_u64(b, "ts", ts);
    buf_key_i64(b, "pid", (int64_t)g_pid);
    buf_key_i64(b, "tid", (int64_t)current_tid());
    if (d)
        buf_key_str(b, "domain", d->name);
}

static void finish(gp_buf* b)
{
    buf_raw(b, "}\n", 2);
    if (!b->failed && g_fd >= 0) {
        pthread_mutex_lock(&g_write_lock);
        const char* p = b->data;
        size_t left = b->len;
        while (left > 0) {
            ssize_t n = write(g_fd, p, left);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                break;
            }
            p += n;
            left -= (size_t)n;
        }
        pthread_mutex_unlock(&g_write_lock);
    }
    buf_free(b);
}

static void add_message_ascii(gp_buf* b, const char* s)
{
    if (!s)
        return;
    buf_key_str(b, "message", s);
    buf_key_str(b, "message_type", "ascii");
}

static void add_message_wide(gp_buf* b, const wchar_t* w)
{
    if (!w)
        return;
    char* s = wide_to_utf8(w);
    if (!s)
        return;
    buf_key_str(b, "message", s);
    buf_key_str(b, "message_type", "unicode");
    free(s);
}

static void add_attributes(gp_buf* b, const gp_domain* d, const nvtxEventAttributes_t* a)
{
    if (!a)
        return;
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
        add_message_ascii(b, a->message.ascii);
        break;
    case NVTX_MESSAGE_TYPE_UNICODE:
        add_message_wide(b, a->message.unicode);
        break;
    case NVTX_MESSAGE_TYPE_REGISTERED:
        if (a->message.registered) {
            buf_key_str(b, "message", ((const gp_string*)a->message.registered)->text);
            buf_key_str(b, "message_type", "registered");
        }
        break;
    default:
        break;
    }
    if (a->category != 0) {
        buf_key_u64(b, "category", a->category);
        const char* cname = category_name(d, a->category);
        if (cname)
            buf_key_str(b, "category_name", cname);
    }
    if (a->colorType == NVTX_COLOR_ARGB)
        buf_key_u64(b, "color", a->color);
    switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64:
        buf_key_u64(b, "payload", a->payload.ullValue);
        buf_key_str(b, "payload_type", "uint64");
        break;
    case NVTX_PAYLOAD_TYPE_INT64:
        buf_key_i64(b, "payload", a->payload.llValue);
        buf_key_str(b, "payload_type", "int64");
        break;
    case NVTX_PAYLOAD_TYPE_DOUBLE:
        buf_key_double(b, "payload", a->payload.dValue);
        buf_key_str(b, "payload_type", "double");
        break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32:
        buf_key_u64(b, "payload", a->payload.uiValue);
        buf_key_str(b, "payload_type", "uint32");
        break;
    case NVTX_PAYLOAD_TYPE_INT32:
        buf_key_i64(b, "payload", a->payload.iValue);
        buf_key_str(b, "payload_type", "int32");
        break;
    case NVTX_PAYLOAD_TYPE_FLOAT:
        buf_key_double(b, "payload", (double)a->payload.fValue);
        buf_key_str(b, "payload_type", "float");
        break;
    case GP_PAYLOAD_TYPE_EXT: {
        buf_key_str(b, "payload_type", "ext");
        const gp_payload_data* pd = (const gp_payload_data*)(uintptr_t)a->payload.ullValue;
        int count = a->reserved0 > 0 ? a->reserved0 : 1;
        buf_key(b, "payload");
        buf_raw(b, "[", 1);
        for (int i = 0; pd && i < count; ++i) {
            if (i)
                buf_raw(b, ",", 1);
            buf_fmt(b, "{\"schema\":%llu,\"size\":%llu}", (unsigned long long)pd[i].schemaId,
                    (unsigned long long)pd[i].size);
        }
        buf_raw(b, "]", 1);
        break;
    }
    default:
        break;
    }
}

/* ------------------------------------------------------------------ */
/* Event helpers shared by the CORE and CORE2 callbacks                */
/* ------------------------------------------------------------------ */

static void ev_mark(const gp_domain* d, const nvtxEventAttributes_t* a, const char* ascii, const wchar_t* wide)
{
    gp_buf b;
    begin(&b, "mark", d, now_ns());
    add_attributes(&b, d, a);
    add_message_ascii(&b, ascii);
    add_message_wide(&b, wide);
    finish(&b);
}

static nvtxRangeId_t ev_range_start(const gp_domain* d, const nvtxEventAttributes_t* a, const char* ascii,
                                    const wchar_t* wide)
{
    uint64_t ts = now_ns();
    nvtxRangeId_t id = __atomic_add_fetch(&g_next_range_id, 1, __ATOMIC_RELAXED);
    gp_buf b;
    begin(&b, "range_start", d, ts);
    buf_key_u64(&b, "id", id);
    add_attributes(&b, d, a);
    add_message_ascii(&b, ascii);
    add_message_wide(&b, wide);
    finish(&b);
    return id;
}

static void ev_range_end(const gp_domain* d, nvtxRangeId_t id)
{
    gp_buf b;
    begin(&b, "range_end", d, now_ns());
    buf_key_u64(&b, "id", id);
    finish(&b);
}

static int ev_push(const gp_domain* d, const nvtxEventAttributes_t* a, const char* ascii, const wchar_t* wide)
{
    uint64_t ts = now_ns();
    int level = depth_push(d);
    gp_buf b;
    begin(&b, "push", d, ts);
    buf_key_i64(&b, "depth", level);
    add_attributes(&b, d, a);
    add_message_ascii(&b, ascii);
    add_message_wide(&b, wide);
    finish(&b);
    return level;
}

static int ev_pop(const gp_domain* d)
{
    uint64_t ts = now_ns();
    int level = depth_pop(d);
    gp_buf b;
    begin(&b, "pop", d, ts);
    buf_key_i64(&b, "depth", level);
    finish(&b);
    return level;
}

static void ev_name_category(gp_domain* d, uint32_t id, const char* name)
{
    uint64_t ts = now_ns();
    if (name) {
        gp_category* c = malloc(sizeof(*c));
        char* copy = strdup(name);
        if (c && copy) {
            c->id = id;
            c->name = copy;
            pthread_mutex_lock(&g_registry_lock);
            c->next = d->categories;
            __atomic_store_n(&d->categories, c, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&g_registry_lock);
        } else {
            free(c);
            free(copy);
        }
    }
    gp_buf b;
    begin(&b, "name_category", d, ts);
    buf_key_u64(&b, "category", id);
    if (name)
        buf_key_str(&b, "category_name", name);
    finish(&b);
}

static void ev_name_thread(uint32_t thread_id, const char* name)
{
    gp_buf b;
    begin(&b, "name_thread", NULL, now_ns());
    buf_key_u64(&b, "target", thread_id);
    if (name)
        buf_key_str(&b, "message", name);
    finish(&b);
}

static nvtxStringHandle_t ev_register_string(gp_domain* d, const char* text, const char* message_type)
{
    uint64_t ts = now_ns();
    gp_string* s = malloc(sizeof(*s));
    char* copy = strdup(text ? text : "");
    if (!s || !copy) {
        free(s);
        free(copy);
        return NULL;
    }
    s->domain = d;
    s->text = copy;
    gp_buf b;
    begin(&b, "register_string", d, ts);
    buf_key_str(&b, "message", copy);
    buf_key_str(&b, "message_type", message_type);
    finish(&b);
    return (nvtxStringHandle_t)s;
}

static nvtxDomainHandle_t ev_domain_create(const char* name)
{
    uint64_t ts = now_ns();
    if (!name)
        name = "";
    gp_domain* d;
    pthread_mutex_lock(&g_registry_lock);
    for (d = g_domains; d; d = d->next)
        if (strcmp(d->name, name) == 0)
            break;
    if (!d) {
        d = calloc(1, sizeof(*d));
        if (d)
            d->name = strdup(name);
        if (d && d->name) {
            d->next = g_domains;
            g_domains = d;
        } else {
            free(d);
            d = NULL;
        }
    }
    pthread_mutex_unlock(&g_registry_lock);
    if (!d)
        return NULL;
    gp_buf b;
    begin(&b, "domain_create", d, ts);
    finish(&b);
    return (nvtxDomainHandle_t)d;
}

/* ------------------------------------------------------------------ */
/* CORE module callbacks (default domain)                              */
/* ------------------------------------------------------------------ */

static void NVTX_API cb_MarkEx(const nvtxEventAttributes_t* a) { ev_mark(&g_default_domain, a, NULL, NULL); }
static void NVTX_API cb_MarkA(const char* m) { ev_mark(&g_default_domain, NULL, m, NULL); }
static void NVTX_API cb_MarkW(const wchar_t* m) { ev_mark(&g_default_domain, NULL, NULL, m); }
static nvtxRangeId_t NVTX_API cb_RangeStartEx(const nvtxEventAttributes_t* a)
{
    return ev_range_start(&g_default_domain, a, NULL, NULL);
}
static nvtxRangeId_t NVTX_API cb_RangeStartA(const char* m) { return ev_range_start(&g_default_domain, NULL, m, NULL); }
static nvtxRangeId_t NVTX_API cb_RangeStartW(const wchar_t* m)
{
    return ev_range_start(&g_default_domain, NULL, NULL, m);
}
static void NVTX_API cb_RangeEnd(nvtxRangeId_t id) { ev_range_end(&g_default_domain, id); }
static int NVTX_API cb_RangePushEx(const nvtxEventAttributes_t* a) { return ev_push(&g_default_domain, a, NULL, NULL); }
static int NVTX_API cb_RangePushA(const char* m) { return ev_push(&g_default_domain, NULL, m, NULL); }
static int NVTX_API cb_RangePushW(const wchar_t* m) { return ev_push(&g_default_domain, NULL, NULL, m); }
static int NVTX_API cb_RangePop(void) { return ev_pop(&g_default_domain); }
static void NVTX_API cb_NameCategoryA(uint32_t c, const char* n) { ev_name_category(&g_default_domain, c, n); }
static void NVTX_API cb_NameCategoryW(uint32_t c, const wchar_t* n)
{
    char* s = wide_to_utf8(n);
    ev_name_category(&g_default_domain, c, s);
    free(s);
}
static void NVTX_API cb_NameOsThreadA(uint32_t t, const char* n) { ev_name_thread(t, n); }
static void NVTX_API cb_NameOsThreadW(uint32_t t, const wchar_t* n)
{
    char* s = wide_to_utf8(n);
    ev_name_thread(t, s);
    free(s);
}

/* ------------------------------------------------------------------ */
/* CORE2 module callbacks (explicit domains)                           */
/* ------------------------------------------------------------------ */

static void NVTX_API cb_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a)
{
    ev_mark(domain_of(d), a, NULL, NULL);
}
static nvtxRangeId_t NVTX_API cb_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a)
{
    return ev_range_start(domain_of(d), a, NULL, NULL);
}
static void NVTX_API cb_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id) { ev_range_end(domain_of(d), id); }
static int NVTX_API cb_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a)
{
    return ev_push(domain_of(d), a, NULL, NULL);
}
static int NVTX_API cb_DomainRangePop(nvtxDomainHandle_t d) { return ev_pop(domain_of(d)); }
static void NVTX_API cb_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t c, const char* n)
{
    ev_name_category(domain_of(d), c, n);
}
static void NVTX_API cb_DomainNameCategoryW(nvtxDomainHandle_t d, uint32_t c, const wchar_t* n)
{
    char* s = wide_to_utf8(n);
    ev_name_category(domain_of(d), c, s);
    free(s);
}
static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringA(nvtxDomainHandle_t d, const char* s)
{
    return ev_register_string(domain_of(d), s, "ascii");
}
static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t* s)
{
    char* u = wide_to_utf8(s);
    nvtxStringHandle_t h = ev_register_string(domain_of(d), u, "unicode");
    free(u);
    return h;
}
static nvtxDomainHandle_t NVTX_API cb_DomainCreateA(const char* name) { return ev_domain_create(name); }
static nvtxDomainHandle_t NVTX_API cb_DomainCreateW(const wchar_t* name)
{
    char* u = wide_to_utf8(name);
    nvtxDomainHandle_t h = ev_domain_create(u);
    free(u);
    return h;
}
static void NVTX_API cb_DomainDestroy(nvtxDomainHandle_t d)
{
    /* The record is kept: handles are compared by address and may still be
     * referenced by registered strings. */
    if (!d)
        return;
    gp_buf b;
    begin(&b, "domain_destroy", domain_of(d), now_ns());
    finish(&b);
}

/* ------------------------------------------------------------------ */
/* Initialization                                                      */
/* ------------------------------------------------------------------ */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_registry_lock);
    pthread_mutex_lock(&g_write_lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&g_write_lock);
    pthread_mutex_unlock(&g_registry_lock);
}

static void atfork_child(void)
{
    pthread_mutex_unlock(&g_write_lock);
    pthread_mutex_unlock(&g_registry_lock);
    g_pid = getpid();
    t_tid = 0;
}

static void init_once(void)
{
    g_pid = getpid();
    pthread_key_create(&g_depth_key, free_depths);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    const char* path = getenv("GPUPROBE_NVTX_CAPTURE_FILE");
    if (!path || !*path) {
        g_open_errno = ENOENT;
        return;
    }
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_fd < 0)
        g_open_errno = errno;
}

#define SET_SLOT(table, size, id, fn)                                                                     \
    do {                                                                                                   \
        if ((unsigned int)(id) < (size) && (table)[id])                                                    \
            *(table)[id] = (NvtxFunctionPointer)(fn);                                                      \
    } while (0)

EXPORT int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    pthread_once(&g_once, init_once);
    if (g_fd < 0) {
        const char* path = getenv("GPUPROBE_NVTX_CAPTURE_FILE");
        if (!path || !*path)
            fprintf(stderr, "gpuprobe nvtx capture: GPUPROBE_NVTX_CAPTURE_FILE is not set; not attaching\n");
        else
            fprintf(stderr, "gpuprobe nvtx capture: cannot open %s: %s; not attaching\n", path,
                    strerror(g_open_errno));
        return 0;
    }
    if (!getExportTable)
        return 0;

    const NvtxExportTableCallbacks* callbacks =
        (const NvtxExportTableCallbacks*)getExportTable(NVTX_ETID_CALLBACKS);
    if (!callbacks || callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
        !callbacks->GetModuleFunctionTable)
        return 0;

    uint32_t version = 0;
    const NvtxExportTableVersionInfo* info = (const NvtxExportTableVersionInfo*)getExportTable(NVTX_ETID_VERSIONINFO);
    if (info && info->struct_size >= sizeof(NvtxExportTableVersionInfo)) {
        version = info->version;
        if (info->SetInjectionNvtxVersion)
            info->SetInjectionNvtxVersion(NVTX_VERSION);
    }

    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table)
        return 0;
    SET_SLOT(table, size, NVTX_CBID_CORE_MarkEx, cb_MarkEx);
    SET_SLOT(table, size, NVTX_CBID_CORE_MarkA, cb_MarkA);
    SET_SLOT(table, size, NVTX_CBID_CORE_MarkW, cb_MarkW);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangeStartEx, cb_RangeStartEx);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangeStartA, cb_RangeStartA);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangeStartW, cb_RangeStartW);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangeEnd, cb_RangeEnd);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangePushEx, cb_RangePushEx);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangePushA, cb_RangePushA);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangePushW, cb_RangePushW);
    SET_SLOT(table, size, NVTX_CBID_CORE_RangePop, cb_RangePop);
    SET_SLOT(table, size, NVTX_CBID_CORE_NameCategoryA, cb_NameCategoryA);
    SET_SLOT(table, size, NVTX_CBID_CORE_NameCategoryW, cb_NameCategoryW);
    SET_SLOT(table, size, NVTX_CBID_CORE_NameOsThreadA, cb_NameOsThreadA);
    SET_SLOT(table, size, NVTX_CBID_CORE_NameOsThreadW, cb_NameOsThreadW);

    table = NULL;
    size = 0;
    if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) && table) {
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainMarkEx, cb_DomainMarkEx);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRangeStartEx, cb_DomainRangeStartEx);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRangeEnd, cb_DomainRangeEnd);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRangePushEx, cb_DomainRangePushEx);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRangePop, cb_DomainRangePop);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainNameCategoryA, cb_DomainNameCategoryA);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainNameCategoryW, cb_DomainNameCategoryW);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, cb_DomainRegisterStringA);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainRegisterStringW, cb_DomainRegisterStringW);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainCreateA, cb_DomainCreateA);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainCreateW, cb_DomainCreateW);
        SET_SLOT(table, size, NVTX_CBID_CORE2_DomainDestroy, cb_DomainDestroy);
    }

    gp_buf b;
    begin(&b, "init", NULL, now_ns());
    buf_key_u64(&b, "version", version);
    finish(&b);
    return 1;
}
