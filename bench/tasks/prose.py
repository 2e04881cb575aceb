"""Generated filler prose: varied English sentences from templates, with seeded randomness.

RULER fills its haystacks with Paul Graham essays; no essay corpus ships here, so sentences
are composed from templates and word lists. Two seeds give different text and a long haystack
rarely repeats a sentence, so reused chunks are not identical. The prose holds no digits, no
hyphens and none of the words the needles use ("magic", "special", "VAR"), so nothing in it
can be mistaken for, or contain, an answer. The other filler, RULER's noise sentences, is
`NOISE`: both are the words a haystack can hold, which the token estimate knows.
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Iterator

# RULER's noise haystack: these few sentences, repeated (`haystack.noise`)
NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
         "There and back again.")

PEOPLE = [
    "the baker", "an old fisherman", "the schoolteacher", "a young shepherd", "the ferryman",
    "my grandmother", "the mayor's clerk", "a travelling musician", "the lighthouse keeper",
    "the weaver", "a retired sailor", "the village doctor", "the carpenter's apprentice",
    "a quiet librarian", "the innkeeper", "a visiting botanist", "the postmistress",
    "two farmers", "the blacksmith", "a group of children", "the miller's daughter",
    "a wandering painter", "the harbour master", "an elderly beekeeper", "the cook",
    "a surveyor from the capital", "the potter", "my neighbour", "a tired messenger",
    "the choir director", "the gardener", "a pair of students",
]
ADJECTIVES = [
    "small", "narrow", "crooked", "heavy", "faded", "polished", "wooden", "bright", "quiet",
    "familiar", "curious", "ordinary", "delicate", "sturdy", "rusty", "forgotten", "newly built",
    "patient", "enormous", "modest", "weathered", "gleaming", "damp", "peculiar", "simple",
    "handsome", "fragile", "ancient", "crowded", "lonely", "cheerful", "unusual", "gentle",
    "restless", "dusty", "carved", "painted", "broken", "elegant", "humble", "stubborn",
    "generous", "noisy", "slender", "golden", "pale", "crimson", "silver", "woollen", "bitter",
]
NOUNS = [
    "lantern", "bridge", "letter", "basket", "garden", "window", "wagon", "staircase", "map",
    "kettle", "fence", "orchard", "clock", "boat", "notebook", "well", "chapel", "ladder",
    "shawl", "bell", "cart", "cottage", "fountain", "path", "harbour", "meadow", "workshop",
    "barn", "chimney", "gate", "violin", "quilt", "compass", "mirror", "saddle", "barrel",
    "courtyard", "library", "market stall", "loom", "telescope", "weathervane", "teapot",
    "hedge", "rowing boat", "printing press", "granary", "stone wall", "wheelbarrow", "kite",
]
PLACES = [
    "by the river", "near the old mill", "in the market square", "on the northern hills",
    "behind the chapel", "along the coast road", "at the edge of the forest", "in the valley",
    "beside the harbour", "on the far side of the lake", "under the elm trees",
    "in the lower town", "at the crossroads", "inside the town hall", "by the railway",
    "on the village green", "near the quarry", "beyond the orchards", "at the top of the lane",
    "in a quiet courtyard", "across the marshes", "outside the bakery",
]
TIMES = [
    "in early spring", "at dawn", "after the harvest", "every winter", "before the storm",
    "on quiet evenings", "late in the autumn", "during the festival", "at midday",
    "after the long rains", "on market days", "in the summer heat", "before breakfast",
    "at the turn of the season", "on the first cold morning", "when the tide was low",
    "long after sunset", "once a year", "on rainy afternoons", "during the holidays",
]
VERBS = [
    "repaired", "painted", "carried", "found", "sold", "described", "admired", "borrowed",
    "measured", "cleaned", "photographed", "sketched", "visited", "rebuilt", "inspected",
    "decorated", "moved", "guarded", "polished", "mended", "praised", "studied", "discovered",
    "returned", "opened", "locked", "replaced", "followed", "shared", "remembered",
]
FEELINGS = [
    "pleased", "surprised", "uneasy", "delighted", "puzzled", "relieved", "proud", "amused",
    "tired", "hopeful", "thoughtful", "content", "restless", "grateful", "cautious",
]
WEATHER = [
    "the wind", "the rain", "the fog", "the morning light", "the snow", "the evening air",
    "the sea breeze", "the frost", "the thunder", "the sunshine", "the mist", "the heat",
]
WEATHER_DOING = [
    "rolled in from the sea", "settled over the rooftops", "lingered until noon",
    "drifted across the fields", "softened the colours of the town", "rattled the shutters",
    "made the streets shine", "kept most people indoors", "faded slowly", "came without warning",
    "turned the roads to mud", "carried the smell of salt",
]
TOPIC_TEMPLATES = [
    "Visitors to {topic} often stop to look at the {adj} {noun} {place}.",
    "Many stories are told about {topic}, most of them involving {person}.",
    "Few people remember how {topic} looked before {person} {verb} the {adj} {noun}.",
    "Travellers describe {topic} as {adj} and strangely {feeling} in mood {time}.",
    "The history of {topic} is closely tied to the {adj} {noun} {place}.",
    "Local guides like to point out the {adj} {noun} that belongs to {topic}.",
]
TEMPLATES = [
    "{Person} {verb} the {adj} {noun} {place} {time}.",
    "{Time}, {person} {verb} {a_adj} {noun} {place}.",
    "Nobody knew why {person} kept the {adj} {noun} {place}.",
    "{Weather} {weather_doing} {time}, and {person} felt {feeling}.",
    "The {adj} {noun} {place} had been {verb} so often that nobody noticed it any more.",
    "{Person} once said that {a_adj} {noun} is worth more than {a_adj2} {noun2}.",
    "It was {time} that {person} first {verb} the {noun} {place}.",
    "{Person} and {person2} argued for an hour about the {adj} {noun}.",
    "There is {a_adj} {noun} {place}, and {person} visits it {time}.",
    "{Person} was {feeling} to see that someone had {verb} the {noun}.",
    "According to {person}, the {noun} {place} was once {adj} and {adj2}.",
    "{Weather} {weather_doing}, so the {adj} {noun} stayed {place} {time}.",
    "Most evenings {person} sat {place} and watched the {adj} {noun}.",
    "The {noun} that {person} {verb} {time} now stands {place}.",
    "If you walk {place} {time}, you may meet {person} carrying {a_adj} {noun}.",
    "{Person} wrote a long letter about the {adj} {noun} and never sent it.",
    "Everyone agreed that the {noun} {place} looked {adj} {time}.",
    "{Person} {verb} the {noun2} while {person2} {verb2} the {adj} {noun}.",
    "People still talk about the {adj} {noun} that {person} {verb} {time}.",
    "{Time}, the {adj} {noun} {place} was the only thing {person} cared about.",
    "{a_adj} {noun} was {verb} {place}, though {person} was {feeling} about it.",
    "{Person} laughed, {verb} the {noun}, and walked home {place}.",
]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def sentence(rng: random.Random, topic: str | None = None) -> str:
    """One generated sentence; with a `topic` (an entity's name), now and then one about it."""
    templates = TEMPLATES if topic is None or rng.random() < 0.8 else TOPIC_TEMPLATES
    slots = {
        "person": rng.choice(PEOPLE), "person2": rng.choice(PEOPLE),
        "adj": rng.choice(ADJECTIVES), "adj2": rng.choice(ADJECTIVES),
        "noun": rng.choice(NOUNS), "noun2": rng.choice(NOUNS),
        "verb": rng.choice(VERBS), "verb2": rng.choice(VERBS),
        "place": rng.choice(PLACES), "time": rng.choice(TIMES),
        "feeling": rng.choice(FEELINGS), "weather": rng.choice(WEATHER),
        "weather_doing": rng.choice(WEATHER_DOING), "topic": topic or "",
    }
    for name in ("adj", "adj2"):
        slots[f"a_{name}"] = ("an " if slots[name][0] in "aeiou" else "a ") + slots[name]
    for name in ("person", "time", "weather"):
        slots[name.capitalize()] = _cap(slots[name])
    return _cap(rng.choice(templates).format(**slots))


def sentences(rng: random.Random, topic: str | None = None,
              paragraph: tuple[int, int] = (4, 9)) -> Iterator[str]:
    """Endless prose as pieces that carry their trailing separator: " " after a sentence,
    a blank line after the last sentence of a paragraph (of 4-9 sentences by default)."""
    left = rng.randint(*paragraph)
    while True:
        left -= 1
        end = "\n\n" if left == 0 else " "
        if left == 0:
            left = rng.randint(*paragraph)
        yield sentence(rng, topic) + end


@lru_cache(maxsize=1)
def vocabulary() -> str:
    """Every word the prose can contain, lowercase, space-separated (for collision checks)."""
    lists = [PEOPLE, ADJECTIVES, NOUNS, PLACES, TIMES, VERBS, FEELINGS, WEATHER, WEATHER_DOING,
             TEMPLATES, TOPIC_TEMPLATES]
    words = {w.strip(".,'{}").lower() for lst in lists for phrase in lst for w in phrase.split()}
    return " ".join(sorted(words))
