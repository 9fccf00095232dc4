/* The segment: create with O_EXCL, reserve memory up front, publish a ready flag last; attach
 * only to a segment whose magic, version and every size and offset match what this build would
 * lay out itself. Also the owner table and the policy slots, which live in the header.
 *
 * The segment is a plain POSIX shm object (/dev/shm/NAME, the same namespace as Python's
 * multiprocessing.shared_memory), opened here rather than through SharedMemory so that no
 * resource tracker ever learns of it: the creator alone decides when to unlink.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "layout.h"

int64_t rl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Every offset is a function of the two capacities alone, so an attacher recomputes them and
 * compares: a segment laid out by another build can never be read with shifted offsets. */
typedef struct {
    uint64_t lanes, owners, rows, intervals, ikeys[2], irows[2], ring, total;
} Layout;

static int Layout_Compute(uint32_t rows, uint32_t ring, Layout *l) {
    if (rows == 0 || ring == 0) return RL_E_VALUE;
    if (rows > (1u << 31) || ring > (1u << 28)) return RL_E_RANGE;
    uint64_t off = align_up(sizeof(rl_header), 4096);
    l->lanes = off;
    off = align_up(off + (uint64_t)RL_MAX_LANES * sizeof(rl_lane), RL_LINE);
    l->owners = off;
    off = align_up(off + (uint64_t)RL_MAX_OWNERS * sizeof(rl_owner), RL_LINE);
    l->rows = off;
    off = align_up(off + (uint64_t)rows * sizeof(rl_row), RL_LINE);
    l->intervals = off;
    off = align_up(off + (uint64_t)rows * 4, RL_LINE);
    for (int g = 0; g < 2; g++) {
        l->ikeys[g] = off;
        off = align_up(off + (uint64_t)rows * 8, RL_LINE);
        l->irows[g] = off;
        off = align_up(off + (uint64_t)rows * 4, RL_LINE);
    }
    l->ring = off;
    off = align_up(off + (uint64_t)ring * sizeof(rl_ring_slot), 4096);
    l->total = off;
    return RL_OK;
}

int rl_segment_size(uint32_t rows, uint32_t ring, uint64_t *bytes) {
    Layout l;
    int rc = Layout_Compute(rows, ring, &l);
    if (rc == RL_OK) *bytes = l.total;
    return rc;
}

int rl_cpu_prefetchw = 0;

/* Once, when the library loads: may rl_prefetch_w use PREFETCHW (CPUID 0x80000001, ECX bit 8)? */
__attribute__((constructor)) static void cpu_probe(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d)) rl_cpu_prefetchw = (c & bit_PRFCHW) != 0;
#endif
}

uint64_t rl_next_serial(void) {
    static _Atomic uint64_t serial;
    return atomic_fetch_add(&serial, 1) + 1;
}

static uint64_t identity_sum(const rl_header *h) {
    const uint8_t *p = (const uint8_t *)h;
    uint64_t sum = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < offsetof(rl_header, identity_sum); i++) sum = (sum ^ p[i]) * 0x100000001b3ULL;
    return sum;
}

static int policy_valid(const rl_policy *p);

static void Seg_Bind(rl_seg *s, uint8_t *base, uint64_t bytes) {
    rl_header *h = (rl_header *)base;
    s->serial = rl_next_serial();
    s->base = base;
    s->bytes = bytes;
    s->h = h;
    s->lanes = (rl_lane *)(base + h->off_lanes);
    s->owners = (rl_owner *)(base + h->off_owners);
    s->rows = (rl_row *)(base + h->off_rows);
    s->intervals = (_Atomic uint32_t *)(base + h->off_intervals);
    for (int g = 0; g < 2; g++) {
        s->ikeys[g] = (_Atomic uint64_t *)(base + h->off_index_keys[g]);
        s->irows[g] = (_Atomic uint32_t *)(base + h->off_index_rows[g]);
    }
    s->ring = (rl_ring_slot *)(base + h->off_ring);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL and we go on */
#endif

/* Map every page of the segment into this process now. A fresh mapping otherwise takes a page
 * fault per row-table page on first touch (measured: a newly attached process ran ~23 us per
 * claim pass, against 1.4, for its first ~1,500 passes). Best effort: a kernel without
 * MADV_POPULATE_WRITE just faults lazily as before. The pages are the segment's own (reserved
 * by posix_fallocate at create), so this allocates nothing. */
int rl_prefault(rl_seg *s) {
    if (!s || !s->base) return RL_E_VALUE;
    (void)madvise(s->base, s->bytes, MADV_POPULATE_WRITE);
    return RL_OK;
}

static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 200) return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] == '/' || name[i] == '\0') return 0;
    return 1;
}

static void shm_path(const char *name, char *out) {
    out[0] = '/';
    strcpy(out + 1, name);
}

int rl_create(const char *name, uint32_t rows, uint32_t ring, const rl_policy *policy,
              int64_t now_ms, rl_seg **out) {
    Layout l;
    char path[256];
    int rc = Layout_Compute(rows, ring, &l);
    if (rc != RL_OK) return rc;
    if (!name_ok(name) || !policy_valid(policy)) return RL_E_VALUE;
    shm_path(name, path);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return errno == EEXIST ? RL_E_EXISTS : RL_E_SYS;
    /* Reserve every page now: an over-committed tmpfs would otherwise SIGBUS on first touch. */
    int err = posix_fallocate(fd, 0, (off_t)l.total);
    if (err == EOPNOTSUPP || err == EINVAL) err = ftruncate(fd, (off_t)l.total) ? errno : 0;
    if (err) {
        close(fd);
        shm_unlink(path);
        return err == ENOSPC ? RL_E_CAPACITY : RL_E_SYS;
    }
    uint8_t *base = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        shm_unlink(path);
        return RL_E_SYS;
    }
    rl_seg *s = calloc(1, sizeof(rl_seg));
    if (!s) {
        munmap(base, l.total);
        shm_unlink(path);
        return RL_E_SYS;
    }
    rl_header *h = (rl_header *)base; /* the object is fresh, so every word is already zero */
    h->magic = RL_MAGIC;
    h->layout_version = RL_LAYOUT_VERSION;
    h->header_bytes = (uint32_t)sizeof(rl_header);
    h->total_bytes = l.total;
    h->max_lanes = RL_MAX_LANES;
    h->max_owners = RL_MAX_OWNERS;
    h->row_capacity = rows;
    h->ring_capacity = ring;
    h->off_lanes = l.lanes;
    h->off_owners = l.owners;
    h->off_rows = l.rows;
    h->off_intervals = l.intervals;
    for (int g = 0; g < 2; g++) {
        h->off_index_keys[g] = l.ikeys[g];
        h->off_index_rows[g] = l.irows[g];
    }
    h->off_ring = l.ring;
    h->created_ms = (uint64_t)now_ms;
    h->identity_sum = identity_sum(h);
    h->policy[0].p = *policy;
    Seg_Bind(s, base, l.total);
    for (uint32_t i = 0; i < RL_MAX_LANES; i++) {
        atomic_store(&s->lanes[i].ring_min, RL_KEY_NONE);
        atomic_store(&s->lanes[i].ring_low, RL_KEY_NONE);
    }
    atomic_store(&h->lease_min, RL_HORIZON); /* no lease yet */
    for (uint32_t o = 0; o < RL_MAX_OWNERS; o++)
        if (rl_beacon_init(&s->owners[o]) != RL_OK) {
            free(s);
            munmap(base, l.total);
            shm_unlink(path);
            return RL_E_SYS;
        }
    for (uint32_t r = 0; r < rows; r++) atomic_store_explicit(&s->rows[r].word, RL_KEY_NONE, memory_order_relaxed);
    snprintf(s->name, sizeof s->name, "%s", name);
    atomic_store(&h->ready, 1); /* last: attachers wait for it */
    *out = s;
    return RL_OK;
}

int rl_layout_check(const void *base_, uint64_t bytes) {
    const rl_header *h = base_;
    Layout l;
    if (bytes < sizeof(rl_header)) return RL_E_LAYOUT;
    if (h->magic != RL_MAGIC || h->layout_version != RL_LAYOUT_VERSION) return RL_E_LAYOUT;
    if (h->header_bytes != sizeof(rl_header) || h->max_lanes != RL_MAX_LANES ||
        h->max_owners != RL_MAX_OWNERS)
        return RL_E_LAYOUT;
    if (Layout_Compute(h->row_capacity, h->ring_capacity, &l) != RL_OK) return RL_E_LAYOUT;
    if (h->total_bytes != l.total || bytes != l.total) return RL_E_LAYOUT;
    if (h->off_lanes != l.lanes || h->off_owners != l.owners || h->off_rows != l.rows ||
        h->off_intervals != l.intervals ||
        h->off_ring != l.ring)
        return RL_E_LAYOUT;
    for (int g = 0; g < 2; g++)
        if (h->off_index_keys[g] != l.ikeys[g] || h->off_index_rows[g] != l.irows[g])
            return RL_E_LAYOUT;
    if (h->identity_sum != identity_sum(h)) return RL_E_LAYOUT;
    /* The shared state must be one this code could have written: positions within capacity,
     * a policy it would accept. Anything else would be read as offsets and lengths. */
    uint64_t head = atomic_load(&h->ring_head), tail = atomic_load(&h->ring_tail);
    if (tail < head || tail - head > h->ring_capacity) return RL_E_LAYOUT;
    if (atomic_load(&h->rows_used) > h->row_capacity) return RL_E_LAYOUT;
    if (atomic_load(&h->rows_void) > atomic_load(&h->rows_used)) return RL_E_LAYOUT;
    for (int g = 0; g < 2; g++) {
        uint32_t count = atomic_load(&h->index_count[g]);
        if (count > h->row_capacity) return RL_E_LAYOUT;
        for (uint32_t l2 = 0; l2 <= RL_MAX_LANES; l2++)
            if (atomic_load(&h->lane_start[g][l2]) > count) return RL_E_LAYOUT;
    }
    if (atomic_load(&h->lanes_high) >= RL_MAX_LANES) return RL_E_LAYOUT;
    if (atomic_load(&h->owners_high) >= RL_MAX_OWNERS) return RL_E_LAYOUT;
    if (!policy_valid(&h->policy[atomic_load(&h->policy_version) & 1].p)) return RL_E_LAYOUT;
    return RL_OK;
}

int rl_attach(const char *name, double timeout_s, rl_seg **out) {
    char path[256];
    if (!name_ok(name)) return RL_E_VALUE;
    shm_path(name, path);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int fd = shm_open(path, O_RDWR, 0);
        if (fd < 0) return errno == ENOENT ? RL_E_NOTFOUND : RL_E_SYS;
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            return RL_E_SYS;
        }
        uint64_t bytes = (uint64_t)st.st_size;
        int ready = 0, rc = RL_E_LAYOUT;
        uint8_t *base = NULL;
        /* A creator goes from size 0 straight to its full size, then writes the magic, then
         * the ready flag. So: size 0 or an all-zero magic may still be a creator at work (wait);
         * any other size below a header, or a foreign magic, is not ours (refuse at once). */
        if (bytes > 0 && bytes < sizeof(rl_header)) {
            close(fd);
            return RL_E_LAYOUT;
        }
        if (bytes >= sizeof(rl_header)) {
            base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (base == MAP_FAILED) {
                close(fd);
                return RL_E_SYS;
            }
            rl_header *h = (rl_header *)base;
            uint64_t magic = h->magic;
            if (magic != 0 && magic != RL_MAGIC) {
                munmap(base, bytes);
                close(fd);
                return RL_E_LAYOUT;
            }
            ready = atomic_load(&h->ready) == 1;
            if (ready) rc = rl_layout_check(base, bytes);
        }
        close(fd);
        if (ready) {
            if (rc != RL_OK) {
                munmap(base, bytes);
                return rc;
            }
            rl_seg *s = calloc(1, sizeof(rl_seg));
            if (!s) {
                munmap(base, bytes);
                return RL_E_SYS;
            }
            Seg_Bind(s, base, bytes);
            rl_prefault(s);
            snprintf(s->name, sizeof s->name, "%s", name);
            *out = s;
            return RL_OK;
        }
        if (base) munmap(base, bytes);
        /* Empty or not yet ready: the creator may be between shm_open and the ready flag. A
         * segment that never becomes ready is refused after the timeout, never read. */
        clock_gettime(CLOCK_MONOTONIC, &t);
        double waited = (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
        if (waited >= timeout_s) return RL_E_TIMEOUT;
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);
    }
}

void rl_close(rl_seg *s) {
    if (!s) return;
    /* A beacon still locked through this mapping by another live thread of this process is on
     * that thread's robust list, which glibc and the kernel walk: unmapping it would leave them
     * a dangling node. Such a mapping (an engine closed from another thread than the one that
     * registered it) is kept until the process exits (csrc/lease.c). */
    rl_beacon_drop(s);
    if (rl_beacon_unmappable(s)) munmap(s->base, s->bytes);
    free(s);
}

int rl_unlink(const char *name) {
    char path[256];
    if (!name_ok(name)) return RL_E_VALUE;
    shm_path(name, path);
    if (shm_unlink(path) != 0) return errno == ENOENT ? RL_E_NOTFOUND : RL_E_SYS;
    return RL_OK;
}

int rl_info_get(rl_seg *s, rl_info *o) {
    rl_header *h = s->h;
    uint64_t gen = atomic_load(&h->index_gen);
    o->magic = h->magic;
    o->layout_version = h->layout_version;
    o->max_lanes = h->max_lanes;
    o->total_bytes = h->total_bytes;
    o->row_capacity = h->row_capacity;
    o->ring_capacity = h->ring_capacity;
    o->rows_used = atomic_load(&h->rows_used);
    o->rows_void = atomic_load(&h->rows_void);
    o->index_count = atomic_load(&h->index_count[gen & 1]);
    o->index_gen = gen;
    o->ring_head = atomic_load(&h->ring_head);
    o->ring_tail = atomic_load(&h->ring_tail);
    o->created_ms = h->created_ms;
    return RL_OK;
}

/* ===================================================================== policy slots ===== */

/* Two slots and a version: a writer fills the inactive slot and flips the version; a reader
 * copies the active slot and retries if its sequence moved (a seqlock without a lock: a writer
 * that dies mid-copy leaves the old slot active). */
void rl_policy_read(rl_seg *s, rl_policy *out) {
    for (;;) {
        uint64_t v = atomic_load(&s->h->policy_version);
        rl_policy_slot *slot = &s->h->policy[v & 1];
        uint32_t q0 = atomic_load(&slot->seq);
        memcpy(out, &slot->p, sizeof *out);
        atomic_thread_fence(memory_order_acquire);
        if (!(q0 & 1) && atomic_load(&slot->seq) == q0 && atomic_load(&s->h->policy_version) == v)
            return;
        sched_yield();
    }
}

/* The policy in force, copied once per thread and policy version (the copy is some 800 bytes
 * with the lane weights: a claim or a write must not pay it every call). The pointer is this
 * thread's copy, good until its next call here; nothing that holds it calls here again. */
static __thread uint64_t tls_policy_seg;
static __thread uint64_t tls_policy_version = UINT64_MAX;
static __thread rl_policy tls_policy;

const rl_policy *rl_policy_cached(rl_seg *s) {
    uint64_t v = atomic_load(&s->h->policy_version);
    if (tls_policy_seg != s->serial || tls_policy_version != v) {
        rl_policy_read(s, &tls_policy);
        tls_policy_seg = s->serial;
        tls_policy_version = atomic_load(&s->h->policy_version) == v ? v : UINT64_MAX;
    }
    return &tls_policy;
}

int rl_policy_get(rl_seg *s, rl_policy *out, uint64_t *version) {
    rl_policy_read(s, out);
    *version = atomic_load(&s->h->policy_version);
    return RL_OK;
}

static int policy_valid(const rl_policy *p) {
    if (p->band_count > RL_MAX_BANDS || p->cold_after < 1 || p->cold_after > 255) return 0;
    for (uint32_t i = 1; i < p->band_count; i++)
        if (p->bands[i] <= p->bands[i - 1]) return 0;
    uint64_t sum = p->urgent_share;
    for (int c = 1; c < RL_CLASSES; c++) sum += p->min_share[c];
    if (p->urgent_share > RL_ONE || sum > RL_ONE + RL_CLASSES) return 0;
    for (int l = 0; l < RL_MAX_LANES; l++)
        if (p->weight[l] < 1 || p->weight[l] > RL_WEIGHT_MAX) return 0;
    return p->remainder <= RL_REMAINDER_LATENESS && p->lanes_enabled <= 1 && p->weights_live <= 1;
}

/* Whether two policies put rows in the same lanes (the weights' interval bounds carry over). */
static int same_layout(const rl_policy *a, const rl_policy *b) {
    return a->lanes_enabled == b->lanes_enabled && a->band_count == b->band_count &&
           memcmp(a->bands, b->bands, a->band_count * sizeof a->bands[0]) == 0;
}

int rl_policy_set(rl_seg *s, const rl_policy *p) {
    if (!policy_valid(p)) return RL_E_VALUE;
    rl_policy was;
    rl_policy_read(s, &was);
    if (!same_layout(&was, p)) /* the rows of the old layout weigh no lane of the new one; a
                                * write racing this may still widen them under the old */
        for (uint32_t l = 0; l < RL_MAX_LANES; l++) {
            atomic_store(&s->lanes[l].wv_min, 0);
            atomic_store(&s->lanes[l].wv_max, 0);
            atomic_fetch_add(&s->h->wv_epoch, 1);
        }
    for (;;) {
        uint64_t v = atomic_load(&s->h->policy_version);
        rl_policy_slot *slot = &s->h->policy[(v + 1) & 1];
        uint32_t q = atomic_load(&slot->seq);
        if (q & 1) { /* another setter is filling it; wait for it to flip */
            sched_yield();
            continue;
        }
        if (!atomic_compare_exchange_strong(&slot->seq, &q, q + 1)) continue;
        memcpy(&slot->p, p, sizeof *p);
        atomic_store(&slot->seq, q + 2);
        if (atomic_compare_exchange_strong(&s->h->policy_version, &v, v + 1)) return RL_OK;
    }
}

int rl_credit_get(rl_seg *s, int64_t *credits) {
    for (int c = 0; c < RL_CLASSES; c++) credits[c] = atomic_load(&s->h->credit[c].credit);
    return RL_OK;
}
