/* The C mirror of engine/keys.py and of LanePolicy.lane_for: the key packing and the lane a
 * row's inputs put it in. tests/shm/test_c_mirror.py holds the two equal. */
#include "layout.h"

uint64_t rl_encode(uint32_t lane, uint64_t due_ms) {
    return (uint64_t)lane * RL_STRIDE + (due_ms & (RL_STRIDE - 1));
}

uint32_t rl_lane_for(const rl_policy *p, uint32_t provenance, uint32_t interval_s,
                     uint32_t failures, int urgent) {
    uint32_t n = p->band_count > RL_MAX_BANDS ? RL_MAX_BANDS : p->band_count;
    uint32_t bands = n + 1;
    if (!p->lanes_enabled || urgent) return 0;
    if (failures >= p->cold_after) return 2 * bands + 1;
    uint32_t band = 0; /* bisect_left: boundaries strictly below the interval */
    while (band < n && p->bands[band] < interval_s) band++;
    return (provenance == RL_PROV_SUBMITTED ? 1 : 1 + bands) + band;
}
