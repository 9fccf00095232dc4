/* Leases: who may render a row, until when, and how a dead holder's rows come back at once.
 *
 * A lease is one 64-bit word per row, [expiry_ms:42][owner:10][tok:12] (csrc/layout.h), taken,
 * renewed and ended by compare-and-swap only. The word itself is the fencing token. A claimer
 * may take a row whose word is free, expired, or held by an owner whose process is gone.
 *
 * Liveness: the authority is kill(pid, 0), memoised per claim pass. A system call costs about
 * 0.5 us on this VM, and with several workers nearly every pass meets another's leases, so each
 * owner slot also carries a beacon: a robust, process-shared mutex that the registering thread
 * locks and keeps. While its futex word names that thread and the kernel has not marked it
 * "owner died" (which it does when the thread ends, however it ends), the owner is alive with
 * no system call. Anything else (no beacon, the thread gone, a word not understood) falls back
 * to kill(pid, 0), so the beacon can only spare a call, never decide that an owner is dead. A
 * reused pid only makes a dead owner look alive, which is the safe side: its rows then come back
 * at expiry instead of at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "layout.h"

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
static void beacon_drop(rl_seg *s) {
    if (!beacon_still_ours(s) || s->beacon_tid != this_tid()) return;
    atomic_store(&s->owners[s->registered].beacon_tid, 0);
    s->beacon_tid = 0;
    pthread_mutex_unlock(&s->owners[s->registered].beacon);
}

/* Before unmapping: whether this mapping may go. A beacon locked through it and still held is a
 * node of its thread's robust list, which glibc and the kernel walk: held by the caller, it is
 * unlocked now; held by another live thread (the engine was closed from a thread other than
 * the one that registered it), the mapping must stay until the process exits. */
int rl_beacon_unmappable(rl_seg *s) {
    beacon_drop(s);
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

int rl_lease_claimable(rl_seg *s, uint64_t w, int64_t now_ms, uint8_t *memo) {
    uint32_t o = RL_LEASE_OWNER(w);
    if (o == 0) return 1;
    if (RL_LEASE_EXPIRY(w) <= now_ms) return 1;
    return !rl_owner_alive(s, o, memo);
}

/* Put back the rows of a batch of leases that are still taken out (FLIGHT), then free the
 * leases. */
static void leases_end(rl_seg *s, uint32_t o, uint32_t n, const uint32_t *rows,
                       const uint64_t *words, uint64_t *leases) {
    uint32_t back[64], m = 0;
    uint64_t flying[64];
    for (uint32_t i = 0; i < n; i++)
        if (words[i] & RL_WORD_FLIGHT) {
            back[m] = rows[i];
            flying[m++] = words[i];
        }
    if (m) (void)rl_flight_return(s, o, m, back, flying, NULL);
    for (uint32_t i = 0; i < n; i++)
        atomic_compare_exchange_strong(&s->rows[rows[i]].lease, &leases[i], RL_LEASE_FREE(leases[i]));
}

/* A closing process ends the leases it still holds before giving up its slot, so no newcomer
 * that reuses the slot inherits them, and puts back the rows they took out (csrc/sweep.c).
 * (A killed process is handled by the sweep and rl_repair instead.) */
int rl_owner_release(rl_seg *s, uint32_t o) {
    if (o == 0 || o >= RL_MAX_OWNERS) return RL_E_RANGE;
    uint32_t used = atomic_load(&s->h->rows_used);
    if (used > s->h->row_capacity) used = s->h->row_capacity;
    uint32_t rows[64], n = 0;
    uint64_t words[64], leases[64];
    for (uint32_t r = 0; r < used; r++) {
        uint64_t w = atomic_load_explicit(&s->rows[r].lease, memory_order_relaxed);
        if (RL_LEASE_OWNER(w) != o) continue;
        rows[n] = r;
        leases[n] = w;
        words[n++] = atomic_load(&s->rows[r].word);
        if (n == 64) {
            leases_end(s, o, n, rows, words, leases);
            n = 0;
        }
    }
    leases_end(s, o, n, rows, words, leases);
    uint64_t held = o;
    atomic_compare_exchange_strong(&s->h->compactor, &held, 0);
    if (s->registered == o) beacon_drop(s); /* before the slot is free: its next owner can take it */
    uint64_t w = atomic_load(&s->owners[o].state);
    if (RL_OWNER_STATE(w) == RL_OWNER_ALIVE)
        atomic_compare_exchange_strong(&s->owners[o].state, &w, RL_OWNER_WORD(RL_OWNER_REG(w), RL_OWNER_FREE));
    return RL_OK;
}


/* After a process died: end its leases, rebuild the index from the row table (a writer killed
 * between storing a row's key and appending it to the ring left that row findable only there),
 * lower every floor to its lane's lowest live row, and free the dead owners' slots. */
int rl_repair(rl_seg *s, uint32_t owner, uint32_t *reclaimed) {
    uint32_t n = atomic_load(&s->h->rows_used), count = 0;
    uint8_t dead[RL_MAX_OWNERS];
    uint64_t words[RL_MAX_OWNERS];
    uint32_t lane_min[RL_MAX_LANES];
    if (n > s->h->row_capacity) n = s->h->row_capacity;
    int rc = rl_compactor_acquire(s, owner);
    if (rc != RL_OK) return rc;
    atomic_store(&s->h->repair_needed, 0);
    for (uint32_t o = 0; o < RL_MAX_OWNERS; o++) {
        words[o] = atomic_load(&s->owners[o].state);
        dead[o] = RL_OWNER_STATE(words[o]) == RL_OWNER_DEAD;
    }
    for (uint32_t r = 0; r < n; r++) {
        uint64_t w = atomic_load(&s->rows[r].lease);
        uint32_t o = RL_LEASE_OWNER(w);
        if (o && dead[o] && atomic_compare_exchange_strong(&s->rows[r].lease, &w, RL_LEASE_FREE(w))) {
            /* Freed, so the full rebuild below indexes it: it is no longer in flight. */
            atomic_fetch_and(&s->rows[r].word, ~RL_WORD_FLIGHT);
            count++;
        }
    }
    rc = rl_compact_locked(s, owner, 1, lane_min);
    rl_compactor_release(s, owner);
    for (uint32_t l = 0; l < RL_MAX_LANES; l++)
        if (lane_min[l] != UINT32_MAX) rl_floor_lower(s, l, lane_min[l]);
    for (uint32_t o = 1; o < RL_MAX_OWNERS; o++)
        if (dead[o])
            atomic_compare_exchange_strong(&s->owners[o].state, &words[o],
                                           RL_OWNER_WORD(RL_OWNER_REG(words[o]), RL_OWNER_FREE));
    if (reclaimed) *reclaimed = count;
    return rc;
}
