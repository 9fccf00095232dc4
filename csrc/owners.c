/* Owners: the processes that hold leases, and how the others know whether they still live.
 *
 * Every process registers an owner slot on first use (a forked child registers its own):
 * [registration:32][FREE|CLAIMING|ALIVE|DEAD:32] in the slot's state word, pid and process start
 * time beside it. Each registration bumps the counter, so marking an owner dead is a CAS against
 * the exact registration found dead: a slot freed and taken by a new process meanwhile is never
 * marked by mistake. Marking one dead sets lease_min to 0 (its rows in flight come back at the
 * next pass, csrc/sweep.c) and asks for a repair (csrc/lease.c).
 *
 * Liveness: the authority is kill(pid, 0), memoised per claim pass. A system call costs about
 * 0.5 us on this VM, and with several workers nearly every pass meets another's leases, so each
 * owner slot also carries a beacon: a robust, process-shared mutex that the registering thread
 * locks and keeps. While its futex word names that thread and the kernel has not marked it
 * "owner died" (which it does when the thread ends, however it ends), the owner is alive with
 * no system call. Anything else (no beacon, the thread gone, a word not understood) falls back
 * to kill(pid, 0), so the beacon can only spare a call, never decide that an owner is dead. A
 * reused pid only makes a dead owner look alive, which is the safe side: its rows then come back
 * at expiry instead of at once (reap() also compares start times).
 *
 * Nothing here calls another file of the core: segment.c, index.c, lease.c and sweep.c call in.
 * docs/design.md §9.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "layout.h"

#define OWNERS_CHECK_NS 100000000LL /* 100 ms: how often a claim pass looks for dead owners */

/* ================================================================ beacons ===== */

#define BEACON_TID_MASK 0x3fffffffu   /* FUTEX_TID_MASK (linux/futex.h) */
#define BEACON_OWNER_DIED 0x40000000u /* FUTEX_OWNER_DIED */

static uint32_t this_tid(void) { return (uint32_t)syscall(SYS_gettid); }

/* The word the kernel maintains for a robust mutex: the holder's tid and the owner-died bit. */
static uint32_t beacon_word(rl_owner *ow) {
#ifdef __GLIBC__
    return __atomic_load_n((unsigned int *)&ow->beacon.__data.__lock, __ATOMIC_ACQUIRE);
#else
    (void)ow;
    return 0; /* layout unknown: no beacon, kill(pid, 0) decides */
#endif
}

int rl_beacon_init(rl_owner *ow) {
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (!rc) rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc) rc = pthread_mutex_init(&ow->beacon, &a);
    pthread_mutexattr_destroy(&a);
    return rc ? RL_E_SYS : RL_OK;
}

/* Whether the beacon this handle locked is still held by that thread of this process (so it is
 * a node of that thread's robust list, at this mapping's address). */
static int beacon_still_ours(rl_seg *s) {
    if (!s->beacon_tid || s->registered == 0 || s->registered >= RL_MAX_OWNERS ||
        s->beacon_pid != (uint32_t)getpid())
        return 0; /* none, or the parent's: a forked child inherits no lock */
    uint32_t word = beacon_word(&s->owners[s->registered]);
    return (word & BEACON_TID_MASK) == s->beacon_tid && !(word & BEACON_OWNER_DIED);
}

/* At registration, in the registering thread: lock the slot's beacon and name this thread. A
 * beacon still held by a live thread of the slot's previous owner (it closed from another
 * thread) stays theirs: this owner then has none, and kill(pid, 0) decides as before. So has
 * a second owner registered through a handle whose first beacon is still held. */
void rl_beacon_take(rl_seg *s, uint32_t o) {
    rl_owner *ow = &s->owners[o];
    atomic_store(&ow->beacon_tid, 0);
    if (beacon_still_ours(s)) return; /* this handle's record must keep naming the beacon held */
    s->registered = o;
    s->beacon_tid = 0;
    s->beacon_pid = (uint32_t)getpid();
    uint32_t me = this_tid();
    int rc = pthread_mutex_trylock(&ow->beacon);
    if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(&ow->beacon);
    if (rc == 0 && (beacon_word(ow) & BEACON_TID_MASK) == me) {
        s->beacon_tid = me;
        atomic_store(&ow->beacon_tid, me);
    }
}

/* Unlock it, when the caller is the thread that holds it (only the holder of a robust mutex may
 * unlock it; another thread's close leaves it to the kernel at that thread's exit). */
void rl_beacon_drop(rl_seg *s) {
    if (!beacon_still_ours(s) || s->beacon_tid != this_tid()) return;
    atomic_store(&s->owners[s->registered].beacon_tid, 0);
    s->beacon_tid = 0;
    pthread_mutex_unlock(&s->owners[s->registered].beacon);
}

/* Before unmapping (after rl_beacon_drop): whether this mapping may go. A beacon locked through
 * it and still held is a node of its thread's robust list, which glibc and the kernel walk:
 * held by another live thread (the engine was closed from a thread other than the one that
 * registered it), the mapping must stay until the process exits. */
int rl_beacon_unmappable(rl_seg *s) {
    return !beacon_still_ours(s);
}

int rl_owner_beacon(rl_seg *s, uint32_t o) {
    if (o == 0 || o >= RL_MAX_OWNERS) return 0;
    rl_owner *ow = &s->owners[o];
    uint32_t tid = atomic_load_explicit(&ow->beacon_tid, memory_order_acquire);
    uint32_t word = beacon_word(ow);
    return tid != 0 && (word & BEACON_TID_MASK) == tid && !(word & BEACON_OWNER_DIED);
}

/* memo[o]: 0 unknown, 1 alive, 2 dead; one byte per owner slot, owned by the caller's pass. */
int rl_owner_alive(rl_seg *s, uint32_t o, uint8_t *memo) {
    if (o == 0 || o >= RL_MAX_OWNERS) return 0;
    if (memo && memo[o]) return memo[o] == 1;
    uint64_t w = atomic_load(&s->owners[o].state);
    uint32_t st = RL_OWNER_STATE(w);
    int alive;
    if (st == RL_OWNER_CLAIMING) {
        alive = 1; /* registering right now: its pid is not written yet */
    } else if (st == RL_OWNER_ALIVE && rl_owner_beacon(s, o)) {
        alive = 1; /* its registering thread still holds the beacon: no system call */
    } else if (st == RL_OWNER_ALIVE) {
        pid_t pid = (pid_t)atomic_load(&s->owners[o].pid);
        alive = !(pid > 0 && kill(pid, 0) != 0 && errno == ESRCH);
        /* Marked against the registration whose pid we read (the word is re-read: a slot that
         * changed hands meanwhile is left alone). */
        if (!alive) {
            if (atomic_load(&s->owners[o].state) == w) rl_owner_mark_dead(s, o, w);
            else alive = 1;
        }
    } else {
        alive = 0; /* DEAD, or FREE: a lease naming a free slot has no holder */
    }
    if (memo) memo[o] = alive ? 1 : 2;
    return alive;
}

/* Whether slot `o` holds an owner not marked dead (alive, or registering): its write journal
 * still counts (csrc/writes.c). A process that is gone but not yet found so counts too: what
 * it left waits for the repair after it is found. */
int rl_owner_live(rl_seg *s, uint32_t o) {
    uint32_t st = RL_OWNER_STATE(atomic_load(&s->owners[o].state));
    return st == RL_OWNER_ALIVE || st == RL_OWNER_CLAIMING;
}

/* ================================================================ the owner table ===== */

int rl_owner_register(rl_seg *s, uint32_t pid, uint64_t start_time, uint32_t *owner) {
    for (uint32_t o = 1; o < RL_MAX_OWNERS; o++) {
        uint64_t w = atomic_load(&s->owners[o].state);
        if (RL_OWNER_STATE(w) != RL_OWNER_FREE) continue;
        uint32_t reg = RL_OWNER_REG(w) + 1;
        if (atomic_compare_exchange_strong(&s->owners[o].state, &w, RL_OWNER_WORD(reg, RL_OWNER_CLAIMING))) {
            atomic_store(&s->owners[o].pid, pid);
            atomic_store(&s->owners[o].start_time, start_time);
            atomic_store(&s->owners[o].hazard, 0);
            for (int j = 0; j < RL_OWNER_WRITES; j++) atomic_store(&s->owners[o].writes[j], 0);
            rl_beacon_take(s, o);
            atomic_store(&s->owners[o].state, RL_OWNER_WORD(reg, RL_OWNER_ALIVE));
            uint32_t high = atomic_load(&s->h->owners_high);
            while (high < o && !atomic_compare_exchange_weak(&s->h->owners_high, &high, o))
                ;
            *owner = o;
            return RL_OK;
        }
    }
    return RL_E_CAPACITY;
}

int rl_owner_get(rl_seg *s, uint32_t o, uint32_t *pid, uint64_t *start, uint64_t *state) {
    if (o == 0 || o >= RL_MAX_OWNERS) return RL_E_RANGE;
    *state = atomic_load(&s->owners[o].state);
    *pid = atomic_load(&s->owners[o].pid);
    *start = atomic_load(&s->owners[o].start_time);
    return RL_OK;
}

int rl_owner_mark_dead(rl_seg *s, uint32_t o, uint64_t seen) {
    if (o == 0 || o >= RL_MAX_OWNERS) return RL_E_RANGE;
    if (RL_OWNER_STATE(seen) != RL_OWNER_ALIVE && RL_OWNER_STATE(seen) != RL_OWNER_CLAIMING) return RL_OK;
    if (atomic_compare_exchange_strong(&s->owners[o].state, &seen,
                                       RL_OWNER_WORD(RL_OWNER_REG(seen), RL_OWNER_DEAD))) {
        rl_lease_min_note(s, 0); /* its leases are claimable now: the next pass sweeps */
        atomic_store(&s->h->repair_needed, 1);
    }
    return RL_OK;
}

/* Every OWNERS_CHECK_NS one claim pass walks the owner table, so a killed owner's rows come back
 * with no supervisor running (csrc/sweep.c): its death sets lease_min to 0. */
static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void rl_owners_check(rl_seg *s) {
    int64_t t = mono_ns(), next = atomic_load_explicit(&s->h->owners_check_ns, memory_order_relaxed);
    if (t < next) return;
    if (!atomic_compare_exchange_strong(&s->h->owners_check_ns, &next, t + OWNERS_CHECK_NS)) return;
    uint32_t high = atomic_load(&s->h->owners_high);
    if (high >= RL_MAX_OWNERS) high = RL_MAX_OWNERS - 1;
    for (uint32_t o = 1; o <= high; o++)
        if (RL_OWNER_STATE(atomic_load(&s->owners[o].state)) == RL_OWNER_ALIVE)
            (void)rl_owner_alive(s, o, NULL); /* marks a dead one, which sets lease_min to 0 */
}

/* Give up slot `o` (a closing process, after its leases ended): the merge word if it held it,
 * its beacon (before the slot is free, so its next owner can take it), then the slot. */
void rl_owner_unregister(rl_seg *s, uint32_t o) {
    uint64_t held = o;
    atomic_compare_exchange_strong(&s->h->compactor, &held, 0);
    if (s->registered == o) rl_beacon_drop(s);
    uint64_t w = atomic_load(&s->owners[o].state);
    if (RL_OWNER_STATE(w) == RL_OWNER_ALIVE)
        atomic_compare_exchange_strong(&s->owners[o].state, &w, RL_OWNER_WORD(RL_OWNER_REG(w), RL_OWNER_FREE));
}
