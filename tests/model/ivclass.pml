/* A model of the interval classes a row word carries (csrc/layout.h: rl_iv_class, rl_word_make;
 * csrc/writes.c: every store of a key; csrc/claim.c: head_interval; csrc/stats.c: verify), checked
 * by spin: tests/model/check.sh (searches named ivclass-*), run by tests/test_model.py. Change
 * them together.
 *
 * Each lane has a table of NS slots, 0 (free) until a writer fills it with an interval, once. A
 * row word's class c > 0 names slot c - 1 of its key's lane; 0 names none (the pass reads the
 * row's interval from the intervals array). Each atomic operation of the C is one step here,
 * in the C's order:
 *
 *   writer   for each of its writes (an add, or a move of a row it added to another lane):
 *            (a) an add stores the row's interval (a move keeps it)
 *            (b) the class, slot by slot: load the slot; free -> CAS 0 -> iv (won: the class is
 *                this slot; lost: the slot's value is what the CAS read); the slot holds iv ->
 *                the class is this slot; else the next slot; none -> class 0
 *            (c) the row word: the key's lane and the class, one store
 *   reader   a claim pass weighing a row it read: load the word; a class c > 0: load slot c - 1
 *            of the word's lane and weigh the row by it
 *
 * Properties:
 *   - every weighing is by the row's own interval (asserted by the reader);
 *   - in every state, every row word's class names a slot holding its row's interval (what
 *     rl_verify checks: RL_V_IV_CLASS), checked by a monitor;
 *   - a slot once filled never changes (asserted by the monitor against its first value).
 *
 * Writes: writer 1 adds row 0 (interval A) and row 3 (B) to lane 0, then moves row 0 to lane 1;
 * writer 2 adds row 1 (B) and row 2 (C) to lane 0. Two slots a lane: lane 0's fill with two of
 * A, B, C in any order, the third getting class 0; A and B race for a free slot; both writers
 * write B, racing to find or fill its slot.
 *
 * Switches (the C is the default; each broken variant must be caught):
 *   -DBROKEN_STORE       a slot filled by a load and a plain store, not a CAS: two writers that
 *                        both saw it free both fill it, the second overwriting the first's
 *   -DBROKEN_KEEP_CLASS  a move keeps the word's old class (the old lane's slot) instead of
 *                        taking the new lane's: restamp did until its key and class were one
 *   -DBROKEN_WORD_FIRST  the word is stored with the first free slot's class before the slot is
 *                        filled
 * and a sanity run, -DREACH_FULL, whose violation shows that a write does find its lane's table
 * full of other intervals (class 0).
 */

#ifndef NS
#define NS 2 /* slots a lane */
#endif
#define NL 2  /* lanes */
#define NR 4  /* rows */
#define NONE 255
#define A 7
#define B 9
#define C 11

byte slot[NL * NS]; /* lane l's slot i: slot[l * NS + i] */
byte first[NL * NS]; /* the monitor's record of each slot's first value */
byte iv[NR];        /* the intervals array */
byte wlane[NR];     /* each row word: its key's lane (NONE: not queued) ... */
byte wcls[NR];      /* ... and its class */
byte done = 0;

/* (b): the class of interval v in lane l, into cls. */
inline iv_class(l, v, cls) {
    i = 0;
    cls = 0;
    do
    :: i == NS -> break
    :: i < NS ->
        cur = slot[l * NS + i];
#ifdef BROKEN_STORE
        if
        :: cur == 0 -> slot[l * NS + i] = v; cur = v
        :: else -> skip
        fi;
#else
        if
        :: cur == 0 ->
            atomic { /* CAS 0 -> v: on failure cur is what it read */
                if
                :: slot[l * NS + i] == 0 -> slot[l * NS + i] = v; cur = v
                :: else -> cur = slot[l * NS + i]
                fi
            }
        :: else -> skip
        fi;
#endif
        if
        :: cur == v -> cls = i + 1; break
        :: else -> i++
        fi
    od
}

/* An add of row r of interval v to lane l: (a), (b), (c). */
inline add(r, l, v) {
    iv[r] = v;
#ifdef BROKEN_WORD_FIRST
    i = 0;
    do
    :: i < NS && slot[l * NS + i] != 0 && slot[l * NS + i] != v -> i++
    :: else -> break
    od;
    if
    :: i < NS -> atomic { wlane[r] = l; wcls[r] = i + 1 }
    :: else -> atomic { wlane[r] = l; wcls[r] = 0 }
    fi;
    iv_class(l, v, cls);
#else
    iv_class(l, v, cls);
    atomic { wlane[r] = l; wcls[r] = cls }
#endif
#ifdef REACH_FULL
    assert(cls != 0);
#endif
}

/* A move of row r to lane l (its interval kept): (b), (c). */
inline move(r, l) {
#ifdef BROKEN_KEEP_CLASS
    atomic { wlane[r] = l }
#else
    iv_class(l, iv[r], cls);
    atomic { wlane[r] = l; wcls[r] = cls }
#endif
}

proctype writer1() {
    byte i, cur, cls;
    add(0, 0, A);
    add(3, 0, B);
    move(0, 1);
    done++
}

proctype writer2() {
    byte i, cur, cls;
    add(1, 0, B);
    add(2, 0, C);
    done++
}

/* A claim pass weighing rows as it reads them, at any moment, any number of times. */
proctype reader() {
    byte r, l, c, v;
    do
    :: done == 2 -> break
    :: else ->
        if
        :: r = 0
        :: r = 1
        :: r = 2
        :: r = 3
        fi;
        atomic { l = wlane[r]; c = wcls[r] }; /* the word, one load */
        if
        :: l != NONE && c > 0 ->
            v = slot[l * NS + c - 1];
            assert(v == iv[r]) /* weighed by its own interval */
        :: else -> skip /* not queued, or weighed by iv[r] itself */
        fi
    od
}

/* The invariants, checked in every state (an assertion spin may schedule at any step). */
active proctype monitor() {
    byte r, k;
    do
    :: atomic {
        r = 0;
        do
        :: r == NR -> break
        :: r < NR ->
            assert(wlane[r] == NONE || wcls[r] == 0 || slot[wlane[r] * NS + wcls[r] - 1] == iv[r]);
            r++
        od;
        k = 0;
        do
        :: k == NL * NS -> break
        :: k < NL * NS ->
            if
            :: first[k] == 0 -> first[k] = slot[k]
            :: else -> assert(slot[k] == first[k]) /* filled once, never changed */
            fi;
            k++
        od
       }
    :: done == 2 -> break
    od
}

init {
    byte r = 0;
    atomic {
        do
        :: r == NR -> break
        :: r < NR -> wlane[r] = NONE; r++
        od;
        run writer1();
        run writer2();
        run reader()
    }
}
