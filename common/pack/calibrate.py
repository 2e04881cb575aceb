"""Calibrating codecs for a model: bit allocations, and the text kvtc calibrates on. Torch-free.

Three allocators, each spending a byte budget where it removes the most damage:
`allocate_layer_bits` (one width per layer, CacheGen), `allocate_kv_widths` (a key and a
value width per layer, kivi, from a measure of each layer's damage) and `allocate_components`
(one quantizer per principal component, kvtc). `CALIBRATION_TEXT` is what kvtc's transform
is fitted on: varied prose, lists, code, tables and dialogue, written for it and used by
nothing that is evaluated (the benchmarks' texts are generated or come from the demo KB).

CacheGen (arXiv:2310.07240, Sec. 5.2) gives shallow layers more bits on the premise that
their KV matters more. Measured on SmolLM2-135M the premise does not hold — a handful of
middle and deep layers dominate the damage (docs/codecs.md) — so the allocation is made from
a per-layer sensitivity instead: how much the model's answers move when only that layer is
quantized coarsely (bench/codec_bench.py measures it as teacher-forced KL).
"""
from __future__ import annotations

import numpy as np


def allocate_layer_bits(sensitivity: list[float], sizes: dict[int, list[int]],
                        budget: int) -> tuple[int, ...]:
    """One bit width per layer, total size within `budget` bytes, damage kept low.

    sensitivity[l]: damage when layer l alone uses the fewest bits; at b more bits it is
    modelled as sensitivity[l] / 4^b (quantization noise power falls 4× per bit).
    sizes[bits][l]: bytes layer l takes at that width. Every layer starts at the fewest bits;
    then the upgrade (one layer, one width up) that removes the most damage per extra byte is
    taken, while the total fits. Raises ValueError if even the fewest bits do not fit.
    """
    widths = sorted(sizes)
    n = len(sensitivity)
    if any(len(sizes[b]) != n for b in widths):
        raise ValueError("sizes must list every layer for every bit width")
    level = [0] * n  # index into widths
    total = sum(sizes[widths[0]])
    if total > budget:
        raise ValueError(f"even {widths[0]} bits everywhere takes {total} bytes > {budget}")

    def damage(layer: int, lv: int) -> float:
        return sensitivity[layer] / 4 ** (widths[lv] - widths[0])

    while True:
        best, best_gain = None, 0.0
        for layer in range(n):
            if level[layer] + 1 == len(widths):
                continue
            extra = sizes[widths[level[layer] + 1]][layer] - sizes[widths[level[layer]]][layer]
            gain = (damage(layer, level[layer]) - damage(layer, level[layer] + 1)) / max(extra, 1)
            if total + extra <= budget and gain > best_gain:
                best, best_gain, best_extra = layer, gain, extra
        if best is None:
            return tuple(widths[lv] for lv in level)
        level[best] += 1
        total += best_extra


def allocate_kv_widths(key_steps: list[float], value_steps: list[float],
                       key_sizes: dict[int, list[int]], value_sizes: dict[int, list[int]],
                       budget: float, measured: tuple[int, int] | None = None,
                       ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """A key width and a value width per layer, total size within `budget` bytes, lowered
    from the widest where it adds the least damage.

    key_sizes[bits][l]: bytes layer l's keys take at that width (likewise values); the widest
    listed is where every layer starts. key_steps[l]: the damage measured when layer l alone
    goes one width down (to `measured`'s (key width, value width); by default the
    second-widest listed), s bits below the top; any other width is priced as quantization
    noise, 4× per bit, so b bits below the top adds steps[l] · (4^b − 1) / (4^s − 1) (s = 1
    when the widths are consecutive, as 5, 4; a top of 8 with 5 measured (s = 3) prices 4
    bits at ~4× the measured 5's damage and 6 at ~1/4 of it).
    Greedy: the lowering (one tensor kind of one layer, to any narrower width) with the least
    added damage per byte saved is taken, until the total fits. Returns (key widths, value
    widths, total bytes); ValueError if even the narrowest widths do not fit."""
    kinds = {"K": (key_steps, key_sizes), "V": (value_steps, value_sizes)}
    top = {k: max(sizes) for k, (_, sizes) in kinds.items()}  # where every layer starts
    if measured is None:
        measured = tuple(max((b for b in sizes if b < top[k]), default=top[k] - 1)
                         for k, (_, sizes) in kinds.items())
    measured = {k: top[k] - m for k, m in zip(kinds, measured)}  # bits below the top
    width = {k: [top[k]] * len(steps) for k, (steps, _) in kinds.items()}
    total = float(sum(sum(sizes[top[k]][:len(steps)]) for k, (steps, sizes) in kinds.items()))

    def damage(kind: str, layer: int, bits: int) -> float:
        return (kinds[kind][0][layer] * (4 ** (top[kind] - bits) - 1)
                / (4 ** measured[kind] - 1))

    while total > budget:
        best = None
        for kind, (steps, sizes) in kinds.items():
            for layer, now in enumerate(width[kind]):
                for bits in (b for b in sizes if b < now):
                    saved = sizes[now][layer] - sizes[bits][layer]
                    if saved > 0:
                        cost = (damage(kind, layer, bits) - damage(kind, layer, now)) / saved
                        if best is None or cost < best[0]:
                            best = (cost, kind, layer, bits, saved)
        if best is None:
            raise ValueError(f"even the narrowest widths take {total:.0f} bytes > {budget:.0f}")
        _, kind, layer, bits, saved = best
        width[kind][layer] = bits
        total -= saved
    return tuple(width["K"]), tuple(width["V"]), total


def allocate_components(error: np.ndarray, rate: np.ndarray, budget: float,
                        iterations: int = 100) -> np.ndarray:
    """One option per component, total rate within `budget`, total error as low as possible.

    error[..., o], rate[..., o]: what option o costs each component (kvtc: measured MSE and
    code entropy of each quantizer step; option 0 drops the component: rate 0). This is the
    paper's dynamic program solved by Lagrangian relaxation (Shoham & Gersho 1988): every
    component takes the option minimizing error + λ·rate, each on its own, and λ is the
    smallest (by bisection) whose total rate fits; the budget left over is then spent on the
    components that the next smaller λ would upgrade, best error drop per rate first. It needs
    no discretized budget and costs a few array passes, so a whole model's components are
    allocated together. Returns the option indices, shape error.shape[:-1].
    """
    error, rate = np.asarray(error, np.float64), np.asarray(rate, np.float64)
    if error.shape != rate.shape or np.any(rate[..., 0] != 0):
        raise ValueError("error and rate must have one shape, and option 0 must cost no rate")

    def choose(log_lam: float) -> np.ndarray:
        return np.argmin(error + 10.0 ** log_lam * rate, axis=-1)

    def spent(choice: np.ndarray) -> float:
        return float(_at(rate, choice).sum())

    lo, hi = -30.0, 30.0  # log10 λ: at lo nothing is dropped, at hi everything is
    if spent(choose(lo)) <= budget:
        return choose(lo)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spent(choose(mid)) > budget else (lo, mid)
    return _fill(choose(hi), choose(lo), error, rate, budget - spent(choose(hi)))


def _at(table: np.ndarray, choice: np.ndarray) -> np.ndarray:
    return np.take_along_axis(table, choice[..., None], -1)[..., 0]


def _fill(low: np.ndarray, high: np.ndarray, error, rate, left: float) -> np.ndarray:
    """Upgrade components from `low` (fits) to `high` (does not) while the budget lasts."""
    cost = _at(rate, high) - _at(rate, low)
    gain = _at(error, low) - _at(error, high)
    out, cost, gain = low.reshape(-1).copy(), cost.reshape(-1), gain.reshape(-1)
    movers = np.flatnonzero((cost > 0) & (gain > 0))
    for i in movers[np.argsort(-gain[movers] / cost[movers], kind="stable")]:
        if cost[i] <= left:
            out[i] = high.reshape(-1)[i]
            left -= cost[i]
    return out.reshape(low.shape)

CALIBRATION_TEXT = """\
The water cycle moves water between the oceans, the air and the land. Sunlight warms the sea \
surface, and water evaporates into vapour that rises until it cools and condenses into clouds. \
When droplets grow heavy enough they fall as rain, snow or hail. Some of it soaks into the \
soil and feeds groundwater; the rest runs off into streams, which carry it back to the sea.

Q: How long does a water molecule stay in the atmosphere?
A: About nine days on average, although it can stay for weeks in a dry, stable air mass.

Recipe for a simple flatbread (serves 4):
1. Mix 250 g of flour, 1 teaspoon of salt and 150 ml of warm water.
2. Knead for 5 minutes until smooth, then rest the dough, covered, for 20 minutes.
3. Divide into 4 balls and roll each one to about 3 mm thick.
4. Cook in a dry, hot pan for 1-2 minutes per side, until brown spots appear.

def moving_average(values, window=3):
    \"\"\"Return the mean of each run of `window` consecutive values.\"\"\"
    if window < 1:
        raise ValueError("window must be positive")
    out = []
    for i in range(len(values) - window + 1):
        out.append(sum(values[i:i + window]) / window)
    return out

"I told you the train leaves at 7:45," said Marta, pulling her coat from the hook. \
"We still have twenty minutes." Her brother shrugged and kept tying his boots. "Twenty \
minutes is plenty if nobody stops to buy coffee," he said, and they both laughed, because \
everybody knew who always stopped to buy coffee.

Quarterly results, in millions of euros: revenue 412.6 (up 8.3%), operating costs 301.2, \
research 47.9, net income 52.4. The board proposed a dividend of 0.85 per share, payable on \
14 June 2024 to shareholders of record on 31 May.

In 1905 Albert Einstein published four papers that changed physics: on the photoelectric \
effect, on Brownian motion, on special relativity, and on the equivalence of mass and \
energy, E = mc^2. The first of them later earned him the 1921 Nobel Prize in Physics.

| city      | country   | population | founded |
|-----------|-----------|------------|---------|
| Kraków    | Poland    | 800,653    | 1257    |
| Porto     | Portugal  | 231,800    | 1123    |
| Kyoto     | Japan     | 1,464,890  | 794     |
| Montréal  | Canada    | 1,762,949  | 1642    |

Dear Mr. Okafor, thank you for your letter of 3 March. We have checked your account and can \
confirm that the duplicate payment of $129.99 was refunded on 6 March; it should appear on \
your statement within five working days. Please reply to this message if it does not.

Photosynthesis turns light, water and carbon dioxide into glucose and oxygen. In the light \
reactions, chlorophyll absorbs photons and splits water; in the Calvin cycle, the enzyme \
RuBisCO fixes carbon dioxide into three-carbon sugars that the plant assembles into glucose.

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS spent
FROM orders
WHERE created_at >= '2023-01-01'
GROUP BY customer_id
HAVING COUNT(*) > 5
ORDER BY spent DESC
LIMIT 20;

Hiking notes, day 3: left the hut at 6:10, crossed the pass (2,614 m) at 9:40 in thin fog, \
lunch by the lake, reached the valley at 15:20. Blister on the left heel; new socks tomorrow. \
Saw two chamois and, briefly, what may have been a golden eagle.

The French Revolution began in 1789 with the storming of the Bastille. Over the next decade \
France abolished feudal privileges, declared the rights of man, executed its king, fought \
wars across Europe and, in 1799, fell under the rule of Napoleon Bonaparte.

User: Can you explain what a hash function is, in one paragraph?
Assistant: A hash function maps data of any size to a fixed-size value, the hash. The same \
input always gives the same hash, a tiny change to the input gives a very different hash, \
and it should be infeasible to find two inputs with the same hash. Hashes are used to check \
files for corruption, to index data in hash tables and to store passwords safely.

Weather for Thursday: cloudy with sunny spells, highs of 17°C, lows of 9°C, wind from the \
south-west at 20 km/h, a 30% chance of showers in the late afternoon. Pollen count: high.

Chess opening: 1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 6. Re1 b5 7. Bb3 d6 \
8. c3 O-O 9. h3 - the closed Ruy Lopez, one of the oldest and most studied openings.

Mitochondria are the organelles where cells turn nutrients into usable energy. They carry \
their own small circular genome, which is inherited from the mother, and they are thought \
to descend from bacteria that were engulfed by an ancestral cell about two billion years ago.

Meeting minutes, project Heron. Present: Li, Sanchez, Novak, Adeyemi. Decisions: ship \
version 2.3 on the 18th; move the database migration to the next sprint; Novak to draft the \
security review by Friday. Open question: do we keep supporting the old export format?

A haiku: autumn moonlight - / a worm digs silently / into the chestnut.

To reset the router, hold the recessed button on the back for ten seconds until the lights \
flash orange, wait two minutes for it to restart, then connect to the network printed on the \
label and open http://192.168.0.1 to choose a new password.

Prime numbers below fifty: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47. There \
are fifteen of them, and their sum is 328. Every even number greater than two is believed, \
but not proven, to be the sum of two primes.

The Amazon river carries more water than any other river on Earth, about a fifth of all the \
fresh water that flows into the oceans. Its basin covers some seven million square \
kilometres across nine countries and holds the largest rainforest in the world.
"""
