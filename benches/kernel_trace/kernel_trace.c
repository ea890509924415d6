/*
 * kernel_trace: a tiny CUDA injection library that gives a per-kernel GPU time
 * breakdown of any CUDA process, through CUPTI activity records.
 *
 *   CUDA_INJECTION64_PATH=/abs/path/libkernel_trace.so  some-cuda-program ...
 *
 * The CUDA driver dlopens this library at cuInit and calls InitializeInjection().
 * libcupti is not linked: it is dlopen'ed at run time ("libcupti.so.13" through the
 * normal search path, or the file named by KERNEL_TRACE_CUPTI), so the build needs
 * CUPTI headers only.
 *
 * Environment:
 *   KERNEL_TRACE_OUT      report path (default kernel_trace.tsv); "%p" is replaced by the pid
 *   KERNEL_TRACE_SKIP_NS  ignore records that start before (earliest start + SKIP_NS)
 *   KERNEL_TRACE_CUPTI    explicit path of libcupti.so.13 (optional)
 *   KERNEL_TRACE_QUIET    if set (non-empty), no messages on stderr except errors
 *
 * Records are kept compactly (32 bytes each) and aggregated when the report is
 * written at exit (atexit -> cuptiActivityFlushAll(1) -> report), so SKIP_NS is exact
 * even though CUPTI delivers buffers out of time order.
 *
 * Record layout: only the leading fields (kind, copyKind, srcKind, dstKind, bytes,
 * start, end, name, memset memoryKind) are read. Their offsets are the same in every
 * CUPTI 13.x record version (Kernel9..Kernel13, Memcpy5..Memcpy7, Memset4..Memset5;
 * newer versions only append fields), so the records emitted by a newer libcupti than
 * the headers read correctly. The _Static_asserts below pin those offsets.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cupti.h>

/* ---------- record types (latest in the headers; the prefix is what matters) ---------- */
#if CUPTI_API_VERSION >= 130500
typedef CUpti_ActivityKernel13 KT_Kernel;
typedef CUpti_ActivityMemcpy7 KT_Memcpy;
typedef CUpti_ActivityMemset5 KT_Memset;
#else
typedef CUpti_ActivityKernel10 KT_Kernel;
typedef CUpti_ActivityMemcpy6 KT_Memcpy;
typedef CUpti_ActivityMemset4 KT_Memset;
#endif

_Static_assert(offsetof(KT_Kernel, kind) == 0, "kernel.kind");
_Static_assert(offsetof(KT_Kernel, start) == 16, "kernel.start");
_Static_assert(offsetof(KT_Kernel, end) == 24, "kernel.end");
_Static_assert(offsetof(KT_Kernel, name) == 104, "kernel.name");
_Static_assert(offsetof(KT_Memcpy, copyKind) == 4, "memcpy.copyKind");
_Static_assert(offsetof(KT_Memcpy, srcKind) == 5, "memcpy.srcKind");
_Static_assert(offsetof(KT_Memcpy, dstKind) == 6, "memcpy.dstKind");
_Static_assert(offsetof(KT_Memcpy, bytes) == 8, "memcpy.bytes");
_Static_assert(offsetof(KT_Memcpy, start) == 16, "memcpy.start");
_Static_assert(offsetof(KT_Memcpy, end) == 24, "memcpy.end");
_Static_assert(offsetof(KT_Memset, bytes) == 8, "memset.bytes");
_Static_assert(offsetof(KT_Memset, start) == 16, "memset.start");
_Static_assert(offsetof(KT_Memset, end) == 24, "memset.end");
_Static_assert(offsetof(KT_Memset, memoryKind) == 50, "memset.memoryKind");

#define NAME_MAX_LEN 200
#define BUF_SIZE (8u * 1024u * 1024u)
#define BUF_ALIGN 8u

/* ---------- CUPTI entry points, resolved with dlsym ---------- */
static struct {
  __typeof__(&cuptiActivityEnable) ActivityEnable;
  __typeof__(&cuptiActivityRegisterCallbacks) ActivityRegisterCallbacks;
  __typeof__(&cuptiActivityFlushAll) ActivityFlushAll;
  __typeof__(&cuptiActivityGetNextRecord) ActivityGetNextRecord;
  __typeof__(&cuptiActivityGetNumDroppedRecords) ActivityGetNumDroppedRecords;
  __typeof__(&cuptiGetResultString) GetResultString;
  __typeof__(&cuptiGetVersion) GetVersion;
} cu;

static int g_quiet;

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[kernel_trace %d] ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static const char *res_str(CUptiResult r) {
  const char *s = NULL;
  if (cu.GetResultString && cu.GetResultString(r, &s) == CUPTI_SUCCESS && s) return s;
  return "?";
}

/* ---------- aggregation state (guarded by g_mu) ---------- */
enum { K_KERNEL = 0, K_HTOD, K_DTOH, K_DTOD, K_MEMCPY_OTHER, K_MEMSET, K_NKINDS };
static const char *const KIND_NAMES[K_NKINDS] = {"kernel",      "memcpy_HtoD",  "memcpy_DtoH",
                                                 "memcpy_DtoD", "memcpy_other", "memset"};

typedef struct {    /* one distinct (kind, name) */
  char *name;       /* owned, truncated to NAME_MAX_LEN */
  uint64_t hash;
  uint32_t kind;
  /* filled at report time */
  uint64_t count, total, min, max, bytes;
} Key;

typedef struct {    /* one activity record, 32 bytes */
  uint64_t start, end, bytes;
  uint32_t key;
  uint32_t pad;
} Rec;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static Key *g_keys;
static size_t g_nkeys, g_capkeys;
static uint32_t *g_slots; /* open addressing: key index + 1, 0 = empty */
static size_t g_nslots;   /* power of two */
static Rec *g_recs;
static size_t g_nrecs, g_caprecs;
static uint64_t g_dropped, g_untimed, g_unknown_kind, g_oom;
static int g_initialized, g_reported;

static uint64_t fnv1a(uint32_t kind, const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull ^ kind;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

static int slots_rebuild(size_t nslots) {
  uint32_t *s = calloc(nslots, sizeof *s);
  if (!s) return -1;
  for (size_t i = 0; i < g_nkeys; i++) {
    size_t j = (size_t)g_keys[i].hash & (nslots - 1);
    while (s[j]) j = (j + 1) & (nslots - 1);
    s[j] = (uint32_t)(i + 1);
  }
  free(g_slots);
  g_slots = s;
  g_nslots = nslots;
  return 0;
}

/* Index of (kind, name), inserted if new; UINT32_MAX on allocation failure. */
static uint32_t key_get(uint32_t kind, const char *name) {
  if (!name) name = "<unknown>";
  size_t n = strnlen(name, NAME_MAX_LEN);
  uint64_t h = fnv1a(kind, name, n);
  if (!g_slots && slots_rebuild(1024) != 0) return UINT32_MAX;
  size_t j = (size_t)h & (g_nslots - 1);
  while (g_slots[j]) {
    Key *k = &g_keys[g_slots[j] - 1];
    if (k->hash == h && k->kind == kind && strncmp(k->name, name, n) == 0 && k->name[n] == '\0')
      return g_slots[j] - 1;
    j = (j + 1) & (g_nslots - 1);
  }
  if (g_nkeys == g_capkeys) {
    size_t cap = g_capkeys ? g_capkeys * 2 : 256;
    Key *nk = realloc(g_keys, cap * sizeof *nk);
    if (!nk) return UINT32_MAX;
    g_keys = nk;
    g_capkeys = cap;
  }
  char *copy = malloc(n + 1);
  if (!copy) return UINT32_MAX;
  memcpy(copy, name, n);
  copy[n] = '\0';
  /* TSV safety: no tabs/newlines in names */
  for (size_t i = 0; i < n; i++)
    if (copy[i] == '\t' || copy[i] == '\n' || copy[i] == '\r') copy[i] = ' ';
  Key *k = &g_keys[g_nkeys];
  memset(k, 0, sizeof *k);
  k->name = copy;
  k->hash = h;
  k->kind = kind;
  g_slots[j] = (uint32_t)(g_nkeys + 1);
  g_nkeys++;
  if (g_nkeys * 2 > g_nslots) slots_rebuild(g_nslots * 2); /* on failure: keeps working, just fuller */
  return (uint32_t)(g_nkeys - 1);
}

static void rec_add(uint32_t kind, const char *name, uint64_t start, uint64_t end, uint64_t bytes) {
  if (start == 0 && end == 0) {
    g_untimed++;
    return;
  }
  if (end < start) end = start;
  uint32_t key = key_get(kind, name);
  if (key == UINT32_MAX) {
    g_oom++;
    return;
  }
  if (g_nrecs == g_caprecs) {
    size_t cap = g_caprecs ? g_caprecs * 2 : (1u << 16);
    Rec *nr = realloc(g_recs, cap * sizeof *nr);
    if (!nr) {
      g_oom++;
      return;
    }
    g_recs = nr;
    g_caprecs = cap;
  }
  Rec *r = &g_recs[g_nrecs++];
  r->start = start;
  r->end = end;
  r->bytes = bytes;
  r->key = key;
  r->pad = 0;
}

static const char *mem_kind_name(unsigned k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "Pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "Pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return "Device";
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return "Array";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return "Managed";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC: return "DeviceStatic";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return "ManagedStatic";
    default: return "Unknown";
  }
}

static const char *copy_kind_name(unsigned k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "Unknown";
  }
}

static void process_record(const CUpti_Activity *a) {
  char nb[64];
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const KT_Kernel *k = (const KT_Kernel *)a;
      rec_add(K_KERNEL, k->name, k->start, k->end, 0);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const KT_Memcpy *m = (const KT_Memcpy *)a;
      uint32_t kind;
      switch (m->copyKind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: kind = K_HTOD; break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: kind = K_DTOH; break;
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: kind = K_DTOD; break;
        default: kind = K_MEMCPY_OTHER; break;
      }
      if (kind == K_MEMCPY_OTHER)
        snprintf(nb, sizeof nb, "%s:%s->%s", copy_kind_name(m->copyKind), mem_kind_name(m->srcKind),
                 mem_kind_name(m->dstKind));
      else
        snprintf(nb, sizeof nb, "%s->%s", mem_kind_name(m->srcKind), mem_kind_name(m->dstKind));
      rec_add(kind, nb, m->start, m->end, m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const KT_Memset *m = (const KT_Memset *)a;
      rec_add(K_MEMSET, mem_kind_name(m->memoryKind), m->start, m->end, m->bytes);
      break;
    }
    default:
      g_unknown_kind++;
      break;
  }
}

/* ---------- CUPTI buffer callbacks ---------- */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *maxNumRecords) {
  *buffer = aligned_alloc(BUF_ALIGN, BUF_SIZE);
  *size = *buffer ? BUF_SIZE : 0;
  *maxNumRecords = 0;
  if (!*buffer) msg("out of memory for a CUPTI buffer; records will be dropped");
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t streamId, uint8_t *buffer, size_t size,
                                      size_t validSize) {
  (void)size;
  if (!buffer) return;
  pthread_mutex_lock(&g_mu);
  if (validSize > 0) {
    CUpti_Activity *rec = NULL;
    for (;;) {
      CUptiResult st = cu.ActivityGetNextRecord(buffer, validSize, &rec);
      if (st == CUPTI_SUCCESS) {
        process_record(rec);
      } else {
        if (st != CUPTI_ERROR_MAX_LIMIT_REACHED) msg("cuptiActivityGetNextRecord: %s", res_str(st));
        break;
      }
    }
  }
  size_t dropped = 0;
  if (cu.ActivityGetNumDroppedRecords(ctx, streamId, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  pthread_mutex_unlock(&g_mu);
  free(buffer);
}

/* ---------- report ---------- */
static int cmp_interval(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
  if (x[1] != y[1]) return x[1] < y[1] ? -1 : 1;
  return 0;
}

/* Union length of n intervals [s,e) stored as pairs; sorts them in place. */
static uint64_t union_ns(uint64_t *iv, size_t n) {
  if (n == 0) return 0;
  qsort(iv, n, 2 * sizeof(uint64_t), cmp_interval);
  uint64_t total = 0, cs = iv[0], ce = iv[1];
  for (size_t i = 1; i < n; i++) {
    uint64_t s = iv[2 * i], e = iv[2 * i + 1];
    if (s > ce) {
      total += ce - cs;
      cs = s;
      ce = e;
    } else if (e > ce) {
      ce = e;
    }
  }
  return total + (ce - cs);
}

static int cmp_key_total_desc(const void *a, const void *b) {
  const Key *x = *(const Key *const *)a, *y = *(const Key *const *)b;
  if (x->total != y->total) return x->total > y->total ? -1 : 1;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* ---------- idle gaps ----------
 * The device is idle between the merged busy intervals of all records. Each gap of at least
 * GAP_MIN_NS is charged to the pair (record that ended last before it, record that starts it);
 * shorter gaps, the back-to-back launch spacing, go to one row. Rows are reported with kind
 * "gap", so a report minus a shorter run's report leaves the extra work's idle time too. */
#define GAP_MIN_NS 10000u

typedef struct {
  uint64_t start, end;
  uint32_t key;
} Iv;

typedef struct {
  uint64_t pair; /* (prev key + 1) << 32 | (next key + 1); 0 = empty slot */
  uint64_t count, total, min, max;
} Gap;

static int cmp_iv(const void *a, const void *b) {
  const Iv *x = a, *y = b;
  if (x->start != y->start) return x->start < y->start ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

#define GAP_SHORT UINT64_MAX       /* the row of gaps under GAP_MIN_NS */
#define GAP_OTHER (UINT64_MAX - 1) /* pairs past half the table (never expected) */

static size_t gap_slot(const Gap *tab, size_t nslots, uint64_t pair) {
  size_t j = (size_t)((pair * 11400714819323198485ull) >> 20) & (nslots - 1);
  while (tab[j].pair && tab[j].pair != pair) j = (j + 1) & (nslots - 1);
  return j;
}

static void gap_add(Gap *tab, size_t nslots, size_t *used, uint64_t pair, uint64_t d) {
  size_t j = gap_slot(tab, nslots, pair);
  if (!tab[j].pair && 2 * (*used + 1) > nslots) j = gap_slot(tab, nslots, pair = GAP_OTHER);
  Gap *g = &tab[j];
  if (!g->pair) {
    g->pair = pair;
    g->min = UINT64_MAX;
    (*used)++;
  }
  g->count++;
  g->total += d;
  if (d < g->min) g->min = d;
  if (d > g->max) g->max = d;
}

/* Gaps between the merged intervals of iv[0..n) (sorted here), charged as described above;
 * the table has nslots (a power of two, more than the distinct pairs). */
static void gaps_collect(Iv *iv, size_t n, Gap *tab, size_t nslots) {
  if (n == 0) return;
  qsort(iv, n, sizeof *iv, cmp_iv);
  uint64_t ce = iv[0].end;
  uint32_t ckey = iv[0].key;
  size_t used = 0;
  for (size_t i = 1; i < n; i++) {
    if (iv[i].start > ce) {
      uint64_t d = iv[i].start - ce;
      uint64_t pair = d >= GAP_MIN_NS ? ((uint64_t)(ckey + 1) << 32) | (uint64_t)(iv[i].key + 1)
                                      : GAP_SHORT;
      gap_add(tab, nslots, &used, pair, d);
    }
    if (iv[i].end > ce) {
      ce = iv[i].end;
      ckey = iv[i].key;
    }
  }
}

static void short_name(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n < cap) {
    memcpy(dst, src, n + 1);
  } else {
    memcpy(dst, src, cap - 4);
    memcpy(dst + cap - 4, "...", 4);
  }
}

static void gaps_write(FILE *f, const Gap *tab, size_t nslots) {
  char a[72], b[72];
  for (size_t j = 0; j < nslots; j++) {
    const Gap *g = &tab[j];
    if (!g->pair) continue;
    if (g->pair == GAP_SHORT) {
      fprintf(f, "gap\t(under %u us, any)", GAP_MIN_NS / 1000u);
    } else if (g->pair == GAP_OTHER) {
      fprintf(f, "gap\t(other pairs)");
    } else {
      short_name(a, sizeof a, g_keys[(g->pair >> 32) - 1].name);
      short_name(b, sizeof b, g_keys[(g->pair & 0xffffffffu) - 1].name);
      fprintf(f, "gap\t%s -> %s", a, b);
    }
    fprintf(f, "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t0\n", g->count,
            g->total, g->total / g->count, g->min, g->max);
  }
}

static char *out_path(void) {
  const char *p = getenv("KERNEL_TRACE_OUT");
  if (!p || !*p) p = "kernel_trace.tsv";
  size_t cap = strlen(p) + 32;
  char *o = malloc(cap);
  if (!o) return NULL;
  size_t j = 0;
  for (const char *s = p; *s && j + 24 < cap; s++) {
    if (s[0] == '%' && s[1] == 'p') {
      j += (size_t)snprintf(o + j, cap - j, "%d", (int)getpid());
      s++;
    } else {
      o[j++] = *s;
    }
  }
  o[j] = '\0';
  return o;
}

static void write_report(void) {
  pthread_mutex_lock(&g_mu);
  if (g_reported) {
    pthread_mutex_unlock(&g_mu);
    return;
  }
  g_reported = 1;

  uint64_t skip_ns = 0;
  const char *sk = getenv("KERNEL_TRACE_SKIP_NS");
  if (sk && *sk) skip_ns = strtoull(sk, NULL, 10);

  uint64_t first_all = UINT64_MAX;
  for (size_t i = 0; i < g_nrecs; i++)
    if (g_recs[i].start < first_all) first_all = g_recs[i].start;
  uint64_t thresh = g_nrecs ? first_all + skip_ns : 0;

  for (size_t i = 0; i < g_nkeys; i++) {
    g_keys[i].count = g_keys[i].total = g_keys[i].max = g_keys[i].bytes = 0;
    g_keys[i].min = UINT64_MAX;
  }
  uint64_t first = UINT64_MAX, last = 0, ksum = 0, nk = 0, nskipped = 0, ncounted = 0;
  size_t nkiv = 0, naiv = 0;
  uint64_t *kiv = malloc((g_nrecs ? g_nrecs : 1) * 2 * sizeof(uint64_t)); /* kernel intervals */
  uint64_t *aiv = malloc((g_nrecs ? g_nrecs : 1) * 2 * sizeof(uint64_t)); /* all intervals */
  Iv *giv = malloc((g_nrecs ? g_nrecs : 1) * sizeof *giv); /* all intervals, for the gaps */
  size_t ngiv = 0;
  for (size_t i = 0; i < g_nrecs; i++) {
    const Rec *r = &g_recs[i];
    if (r->start < thresh) {
      nskipped++;
      continue;
    }
    Key *k = &g_keys[r->key];
    uint64_t d = r->end - r->start;
    k->count++;
    k->total += d;
    k->bytes += r->bytes;
    if (d < k->min) k->min = d;
    if (d > k->max) k->max = d;
    if (r->start < first) first = r->start;
    if (r->end > last) last = r->end;
    ncounted++;
    if (k->kind == K_KERNEL) {
      ksum += d;
      nk++;
      if (kiv) {
        kiv[2 * nkiv] = r->start;
        kiv[2 * nkiv + 1] = r->end;
        nkiv++;
      }
    }
    if (giv) giv[ngiv++] = (Iv){r->start, r->end, r->key};
    if (aiv) {
      aiv[2 * naiv] = r->start;
      aiv[2 * naiv + 1] = r->end;
      naiv++;
    }
  }
  uint64_t span = ncounted ? last - first : 0;
  uint64_t kbusy = kiv ? union_ns(kiv, nkiv) : 0;
  uint64_t abusy = aiv ? union_ns(aiv, naiv) : 0;
  free(kiv);
  free(aiv);
  size_t ngslots = 4096;
  while (ngslots < 16 * g_nkeys) ngslots *= 2;
  Gap *gaps = calloc(ngslots, sizeof *gaps);
  if (giv && gaps) gaps_collect(giv, ngiv, gaps, ngslots);
  free(giv);

  Key **order = malloc((g_nkeys ? g_nkeys : 1) * sizeof *order);
  size_t nrows = 0;
  if (order) {
    for (size_t i = 0; i < g_nkeys; i++)
      if (g_keys[i].count) order[nrows++] = &g_keys[i];
    qsort(order, nrows, sizeof *order, cmp_key_total_desc);
  }

  uint32_t ver = 0;
  if (cu.GetVersion) cu.GetVersion(&ver);

  char *path = out_path();
  char *tmp = path ? malloc(strlen(path) + 32) : NULL;
  FILE *f = NULL;
  if (tmp) {
    sprintf(tmp, "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "w");
  }
  if (!f) {
    msg("cannot write report %s: %s", path ? path : "(null)", strerror(errno));
  } else {
    fprintf(f, "# kernel_trace pid=%d cupti_api=%u headers_api=%d\n", (int)getpid(), ver,
            (int)CUPTI_API_VERSION);
    fprintf(f, "# span_ns=%" PRIu64 "\n", span);
    fprintf(f, "# kernel_busy_ns=%" PRIu64 "\n", kbusy);
    fprintf(f, "# kernel_sum_ns=%" PRIu64 "\n", ksum);
    fprintf(f, "# n_kernels=%" PRIu64 "\n", nk);
    fprintf(f, "# gpu_busy_ns=%" PRIu64 "\n", abusy); /* union of kernels + memcpy + memset */
    fprintf(f, "# first_start_ns=%" PRIu64 "\n", ncounted ? first : 0);
    fprintf(f, "# last_end_ns=%" PRIu64 "\n", last);
    fprintf(f, "# skip_ns=%" PRIu64 "\n", skip_ns);
    fprintf(f, "# n_records=%zu\n", g_nrecs);
    fprintf(f, "# n_records_skipped=%" PRIu64 "\n", nskipped);
    fprintf(f, "# n_records_untimed=%" PRIu64 "\n", g_untimed);
    fprintf(f, "# n_records_dropped=%" PRIu64 "\n", g_dropped);
    fprintf(f, "# n_records_lost_oom=%" PRIu64 "\n", g_oom);
    fprintf(f, "# columns=kind\tname\tcount\ttotal_ns\tavg_ns\tmin_ns\tmax_ns\tbytes\n");
    for (size_t i = 0; i < nrows; i++) {
      const Key *k = order[i];
      fprintf(f, "%s\t%s\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\n",
              KIND_NAMES[k->kind], k->name, k->count, k->total, k->total / k->count, k->min, k->max,
              k->bytes);
    }
    if (gaps) gaps_write(f, gaps, ngslots);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
      msg("error writing %s", tmp);
    } else if (rename(tmp, path) != 0) {
      msg("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    } else if (!g_quiet) {
      msg("wrote %s: %" PRIu64 " kernels, span %.3f ms, kernel busy %.3f ms (%.1f%%), %zu distinct names",
          path, nk, span / 1e6, kbusy / 1e6, span ? 100.0 * (double)kbusy / (double)span : 0.0, nrows);
    }
  }
  if (g_dropped) msg("warning: CUPTI dropped %" PRIu64 " records", g_dropped);
  free(tmp);
  free(path);
  free(order);
  free(gaps);
  pthread_mutex_unlock(&g_mu);
}

static void at_exit(void) {
  if (!g_initialized) return;
  /* Must not hold g_mu here: the flush calls buffer_completed on this thread. */
  CUptiResult st = cu.ActivityFlushAll(1 /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED */);
  if (st != CUPTI_SUCCESS) msg("cuptiActivityFlushAll: %s", res_str(st));
  write_report();
}

/* ---------- entry point ---------- */
static void *load_cupti(void) {
  const char *names[4];
  int n = 0;
  const char *env = getenv("KERNEL_TRACE_CUPTI");
  if (env && *env) names[n++] = env;
  names[n++] = "libcupti.so.13";
  names[n++] = "libcupti.so";
  for (int i = 0; i < n; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
    msg("dlopen(%s) failed: %s", names[i], dlerror());
  }
  return NULL;
}

#define SYM(field, sym)                                   \
  do {                                                    \
    *(void **)(&cu.field) = dlsym(h, #sym);               \
    if (!cu.field) {                                      \
      msg("libcupti lacks %s: %s", #sym, dlerror());      \
      return 1;                                           \
    }                                                     \
  } while (0)

__attribute__((visibility("default"))) int InitializeInjection(void) {
  static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
  static int done;
  pthread_mutex_lock(&once);
  if (done) {
    pthread_mutex_unlock(&once);
    return 1;
  }
  done = 1;
  pthread_mutex_unlock(&once);

  const char *q = getenv("KERNEL_TRACE_QUIET");
  g_quiet = q && *q;

  void *h = load_cupti();
  if (!h) {
    msg("CUPTI not found: put the directory of libcupti.so.13 on LD_LIBRARY_PATH or set KERNEL_TRACE_CUPTI; "
        "tracing disabled");
    return 1; /* never break the traced process */
  }
  SYM(ActivityEnable, cuptiActivityEnable);
  SYM(ActivityRegisterCallbacks, cuptiActivityRegisterCallbacks);
  SYM(ActivityFlushAll, cuptiActivityFlushAll);
  SYM(ActivityGetNextRecord, cuptiActivityGetNextRecord);
  SYM(ActivityGetNumDroppedRecords, cuptiActivityGetNumDroppedRecords);
  SYM(GetResultString, cuptiGetResultString);
  SYM(GetVersion, cuptiGetVersion);

  CUptiResult st = cu.ActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (st != CUPTI_SUCCESS) {
    msg("cuptiActivityRegisterCallbacks: %s; tracing disabled", res_str(st));
    return 1;
  }
  static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET};
  static const char *const knames[] = {"CONCURRENT_KERNEL", "MEMCPY", "MEMSET"};
  int enabled = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    st = cu.ActivityEnable(kinds[i]);
    if (st != CUPTI_SUCCESS)
      msg("cuptiActivityEnable(%s): %s", knames[i], res_str(st));
    else
      enabled++;
  }
  if (!enabled) return 1;
  g_initialized = 1;
  atexit(at_exit);
  if (!g_quiet) {
    uint32_t ver = 0;
    cu.GetVersion(&ver);
    char *p = out_path();
    msg("tracing (CUPTI api %u), report at exit to %s", ver, p ? p : "?");
    free(p);
  }
  return 1;
}
