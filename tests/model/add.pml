/* A model of the add path's reservation and of the repair that rolls a dead writer's add forward
 * or back, checked by spin: tests/model/check.sh (searches named add-*), run by
 * tests/test_model.py. The code modelled is rl_add_many and its write journal (csrc/writes.c),
 * rl_repair's settling of reserved rows (csrc/lease.c, reserved_settle in csrc/writes.c) and the
 * crash marks rl_verify tells from violations (csrc/stats.c). Change them together.
 *
 * Processes: NWR writers, each making NA adds of K rows and able to die (SIGKILL) before any
 * of its steps; a reaper making NRP repairs at any moment; then, once every writer has ended,
 * one last repair. Each atomic operation of the C is one step here, in the C's order:
 *
 *   writer   (a) first = rows_used (load); take a journal slot: journal = [first, K)
 *            (b) CAS rows_used first -> first + K; on failure journal = [new first, K), again
 *            (c) for each row: its word (EMPTY -> QUEUED; the interval store before it is not
 *                a step: nothing reads it to decide)
 *            (d) publish: the row becomes findable (ring append, floor lower: floor.pml)
 *            (e) journal = none; the add returns (its rows are acknowledged)
 *   death    a writer may die before any step; its owner is then marked dead at any later
 *            moment (a claim pass's owner check, reap()), or not at all before a repair runs
 *   reaper   rl_repair: (1) U = rows_used; (2) the live owners' journals (an owner not yet
 *            marked dead is live); (3) each row below U: EMPTY and covered by no live journal
 *            -> CAS EMPTY -> VOID (taken back); (4) the full rebuild: every QUEUED row is
 *            findable; (5) the journals of the owners marked dead are cleared (slots freed)
 *
 * Properties:
 *   - a writer never finds a row it reserved taken back (asserted at its store, (c));
 *   - crash or violation (what rl_verify may call a crash mark): in every state, a QUEUED row
 *     that is not findable is covered by its writer's journal (in progress, or a dead writer's
 *     unfinished write), never left bare;
 *   - at the end (every writer ended, the last repair done): every acknowledged row is QUEUED,
 *     every row below rows_used is QUEUED or VOID (none counted but empty), and every QUEUED
 *     row is findable.
 *
 * Abstractions: a row's key, interval and lane are one word (its value does not matter here,
 * only whether it was written); publishing is one step (floor.pml checks what it does to the
 * index, ring and floors); a writer holds one journal slot (the C's several slots per owner are
 * taken by CAS, one per thread); owners are not reused (a freed slot's registration clears the
 * journal, which (5) models).
 *
 * Switches (the C is the default; each broken variant must be caught):
 *   -DNO_SETTLE        the repair takes nothing back (the C before this model): a writer killed
 *                      between its reservation and its stores leaves rows counted but empty
 *   -DJOURNAL_AFTER    the journal is written after the reservation's CAS, not before it
 *   -DSETTLE_IGNORES_LIVE  the repair takes back empty rows whatever the live journals say
 *   -DDROP_BEFORE_PUBLISH  the journal is cleared after the stores but before the publish
 *   -DSETTLE_JOURNALS_FIRST  the repair reads the journals before rows_used
 */

#ifndef NWR
#define NWR 2   /* writers */
#endif
#ifndef NA
#define NA 1    /* adds per writer */
#endif
#ifndef K
#define K 2     /* rows per add */
#endif
#ifndef NRP
#define NRP 1   /* repairs while writers run */
#endif
#define CAP (NWR * NA * K)
#define NONE 255

#define EMPTY 0
#define QUEUED 1
#define VOID 2

byte word[CAP];          /* EMPTY, QUEUED, VOID */
bool findable[CAP];
bool acked[CAP];
byte used;               /* rows_used */
byte jfirst[NWR];        /* journal: [jfirst, jfirst + K), NONE = no write under way */
bool dead[NWR];          /* the process is gone */
bool marked[NWR];        /* its owner is marked dead (the repair no longer counts it live) */
byte ended;              /* writers that returned or died */

/* A QUEUED row not findable is covered by its writer's journal (live or dead). */
#define COVERED(r, w) (NWR > (w) && jfirst[w] != NONE && jfirst[w] <= (r) && (r) < jfirst[w] + K)
#define MARKED_OK(r)                                                                           \
    ((r) >= CAP || word[r] != QUEUED || findable[r] || COVERED(r, 0) || COVERED(r, 1) ||          \
     COVERED(r, 2))
#define ALL_MARKED_OK                                                                          \
    (MARKED_OK(0) && MARKED_OK(1) && MARKED_OK(2) && MARKED_OK(3) && MARKED_OK(4) &&            \
     MARKED_OK(5) && MARKED_OK(6) && MARKED_OK(7))

#define MAYBE_DIE(w)                  \
    if                                \
    :: skip                           \
    :: d_step { dead[w] = 1; ended++ }; goto gone \
    fi

proctype writer(byte w) {
    byte a, first, i;
    for (a : 1 .. NA) {
        MAYBE_DIE(w);
#ifndef JOURNAL_AFTER
        d_step { first = used; jfirst[w] = first }
#else
        first = used;
#endif
        do
        :: MAYBE_DIE(w);
           if
           :: d_step { used == first -> used = first + K }
#ifdef JOURNAL_AFTER
              MAYBE_DIE(w);
              jfirst[w] = first;
#endif
              break
           :: else ->
              MAYBE_DIE(w);
#ifndef JOURNAL_AFTER
              d_step { first = used; jfirst[w] = first }
#else
              first = used
#endif
           fi
        od;
        for (i : 0 .. K - 1) {
            MAYBE_DIE(w);
            d_step { assert(word[first + i] == EMPTY); word[first + i] = QUEUED }
        }
#ifdef DROP_BEFORE_PUBLISH
        MAYBE_DIE(w);
        jfirst[w] = NONE;
#endif
        MAYBE_DIE(w);
        d_step {
            for (i : 0 .. K - 1) { findable[first + i] = 1 }
            i = 0
        }
#ifndef DROP_BEFORE_PUBLISH
        MAYBE_DIE(w);
        jfirst[w] = NONE;
#endif
        d_step { for (i : 0 .. K - 1) { acked[first + i] = 1 }; i = 0 }
    }
    ended++;
gone:
    skip
}

/* rl_repair: marks no one (the marker below does), settles reserved rows, rebuilds. */
inline repair() {
    /* a dead owner is noticed by now, or not yet */
    if
    :: dead[0] && !marked[0] -> marked[0] = 1
    :: skip
    fi;
    if
    :: NWR > 1 && dead[1] && !marked[1] -> marked[1] = 1
    :: skip
    fi;
#ifndef SETTLE_JOURNALS_FIRST
    u = used;
#endif
    d_step {
        for (w : 0 .. NWR - 1) { lf[w] = (marked[w] -> NONE : jfirst[w]) }
        w = 0
    }
#ifdef SETTLE_JOURNALS_FIRST
    u = used;
#endif
#ifndef NO_SETTLE
    for (r : 0 .. CAP - 1) {
        d_step {
            if
            :: r < u && word[r] == EMPTY ->
               cov = 0;
#ifndef SETTLE_IGNORES_LIVE
               for (w : 0 .. NWR - 1) {
                   if
                   :: lf[w] != NONE && lf[w] <= r && r < lf[w] + K -> cov = 1
                   :: else -> skip
                   fi
               }
               w = 0;
#endif
               if
               :: !cov -> word[r] = VOID
               :: else -> skip
               fi
            :: else -> skip
            fi
        }
    }
    r = 0;
#endif
    d_step {
        for (r : 0 .. CAP - 1) {
            if
            :: word[r] == QUEUED -> findable[r] = 1
            :: else -> skip
            fi
        }
        r = 0
    }
    d_step {
        for (w : 0 .. NWR - 1) {
            if
            :: marked[w] -> jfirst[w] = NONE
            :: else -> skip
            fi
        }
        w = 0
    }
}

proctype reaper() {
    byte n, u, r, w, cov;
    byte lf[NWR];
    for (n : 1 .. NRP) { repair() }
    ended == NWR;
    repair();
    /* the end: every writer returned or died, and the last repair saw every dead one marked,
     * or it ran before a marking: mark them all and repair once more, as the next reap does */
    d_step { for (w : 0 .. NWR - 1) { marked[w] = dead[w] }; w = 0 }
    repair();
    d_step {
        for (r : 0 .. CAP - 1) {
            assert(!acked[r] || word[r] == QUEUED);
            assert(r >= used || word[r] != EMPTY);
            assert(word[r] != QUEUED || findable[r])
        }
        r = 0
    }
}

/* Crash or violation, in every state (CAP <= 8). */
active proctype monitor() {
end:
    atomic { !ALL_MARKED_OK -> assert(ALL_MARKED_OK) }
}

init {
    byte w;
    d_step {
        for (w : 0 .. NWR - 1) { jfirst[w] = NONE }
        w = 0
    }
    atomic {
        for (w : 0 .. NWR - 1) { run writer(w) }
        run reaper()
    }
}
