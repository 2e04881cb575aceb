"""Seeded randomness and the values that become answers: numbers, strings, keys, names, words.

Every draw within an item goes through one `Uniques`, so no value is ever drawn twice and an
answer appears only where the generator put it. Value shapes are chosen so that no two
values of one kind can be substrings of each other (fixed lengths; key words of which none
is part of another), which keeps substring scoring from crediting one answer for another.
"""
from __future__ import annotations

import random
import string
from typing import Callable

KEY_ADJECTIVES = """
abundant agile amber ancient arctic ashen autumn bashful bitter blazing bold brave breezy
bright brisk broad bronze busy calm candid careful cheerful chilly clever cloudy coastal
cobalt copper cosmic crimson crisp curious daring dashing dusty eager early earnest elegant
emerald fabled faint fearless fierce fiery fluffy fragrant frosty gentle giant gilded glassy
gleaming golden graceful grand granite hidden hollow honest humble icy idle indigo ivory
jade jolly jovial keen kindly lavish lazy little lively lonely loyal lucky lunar marble
meadow mellow merry mighty misty modest mossy nimble noble northern oaken olive opal orange
patient prudent pensive placid peaceful polar proud quaint quick quiet radiant rapid rosy
royal rugged rustic sandy scarlet serene shady shiny silent silver silky sleepy slender
smoky snowy solar sombre spry stark steady stormy sturdy sunny swift tawny tender thorny
tidal timid tranquil twilight velvet vivid wandering wary wild windy wintry wise witty
woolly young zealous
""".split()

KEY_NOUNS = """
acorn albatross anchor anvil apricot archer atlas badger banjo barley basin beacon beetle
birch bison blossom bobcat boulder bramble breeze brook buffalo bugle cabin cactus camel
canyon caravan cedar cello chariot cherry chestnut cinder citadel clover comet compass
condor coral cormorant cottage cricket crystal cypress dagger dahlia delta dolphin dragon
drum eagle easel ember falcon fern ferret fiddle fjord flamingo forge fountain fox galleon
garnet gazelle geyser glacier goblet gondola granary griffin grove gull harbor harp hawk
hazel heron hickory horizon hornet iris island jackal jaguar jasmine kestrel kettle lantern
lark laurel lemur lily lynx magnolia mammoth mango maple marlin mongoose meteor minnow
monsoon moose nebula nectar nutmeg oasis ocelot orchard orchid osprey otter owl panther
parrot pebble pelican penguin pepper pine plover plume prairie quail quarry quill raven reef
ridge robin saddle salmon sapphire scroll sequoia sparrow spruce squirrel starling summit
swan thistle thunder tiger topaz tortoise trumpet tulip tundra turnip valley violin walnut
walrus willow wolf wren yak zebra
""".split()

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


def make_rng(family: str, seed: int, stream: str) -> random.Random:
    """An independent, reproducible random stream per (task family, seed, purpose), so that
    e.g. an item's needles stay the same when only its length changes."""
    return random.Random(f"{family}/{seed}/{stream}")


class Uniques:
    """Draws values never drawn before by this instance (one instance per item)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def draw(self, make: Callable[[], str], ok: Callable[[str], bool] = lambda v: True) -> str:
        for _ in range(10_000):
            value = make()
            if value not in self.used and ok(value):
                self.used.add(value)
                return value
        raise RuntimeError("ran out of distinct values: the requested context is too long "
                           "for this value space")

    def number(self, digits: int = 7) -> str:
        """A `digits`-long decimal number (no leading zero)."""
        return self.draw(lambda: str(self.rng.randrange(10 ** (digits - 1), 10 ** digits)))

    def string(self, length: int = 8) -> str:
        """Lowercase letters and digits, never four digits in a row (so it never reads as, or
        hides, a number answer)."""
        alphabet = string.ascii_lowercase + string.digits

        def make() -> str:
            return "".join(self.rng.choice(alphabet) for _ in range(length))
        return self.draw(make, lambda v: not any(v[i:i + 4].isdigit()
                                                   for i in range(length - 3)))

    def key(self) -> str:
        """An adjective-noun key ("amber-falcon"); three words ("amber-falcon-willow") once
        the two-word space is a third used. A three-word key never extends a two-word key
        already drawn, so no key is a prefix of another in one item."""
        space = len(KEY_ADJECTIVES) * len(KEY_NOUNS)
        if len(self.used) < space // 3:
            return self.draw(lambda: f"{self.rng.choice(KEY_ADJECTIVES)}-"
                                      f"{self.rng.choice(KEY_NOUNS)}")
        return self.draw(lambda: f"{self.rng.choice(KEY_ADJECTIVES)}-"
                                  f"{self.rng.choice(KEY_NOUNS)}-{self.rng.choice(KEY_NOUNS)}",
                          lambda v: v.rsplit("-", 1)[0] not in self.used)

    def word(self, syllables: int = 3) -> str:
        """A pronounceable made-up word of fixed length ("balomi"): equal lengths mean no word
        is a substring of another."""
        return self.draw(lambda: "".join(self.rng.choice(CONSONANTS) + self.rng.choice(VOWELS)
                                          for _ in range(syllables)))

    def var_name(self, avoid: str = "", length: int = 5) -> str:
        """An uppercase variable name (RULER's "VAR QWXYZ") that is no part of `avoid` in any
        case (pass the haystack's vocabulary)."""
        avoid = avoid.lower()
        return self.draw(lambda: "".join(self.rng.choice(string.ascii_uppercase)
                                          for _ in range(length)),
                          lambda v: v.lower() not in avoid)
