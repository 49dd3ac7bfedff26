#!/usr/bin/env python3
"""Writes the accuracy gate's corpus: crates/streampool-nn/src/accuracy/corpus.txt.

A fixed set of distinct English sentences of mixed lengths (a few words to a paragraph of
about 150 words), one per line, made from the word lists below with a fixed seed: no
downloads, and a rerun writes the same bytes. The sentences fall into topics so that
nearest neighbours within the corpus mean something (a sentence about tides has other
sentences about the sea near it), which is what the gate's retrieval-agreement measure
compares between a quantized model and its f32 self.

Usage: python3 scripts/make_gate_corpus.py
"""

import os
import random

SENTENCES = 2000
SEED = 20261127

TOPICS = {
    "cooking": (
        "chef oven recipe garlic onion broth sauce pan knife flour butter salt pepper soup "
        "bread dough kitchen spoon stew rice noodle lemon herb basil tomato".split(),
        "simmers bakes chops stirs roasts seasons tastes kneads grills whisks".split(),
        "crispy tender savory bitter sweet spicy fresh smoky creamy golden".split(),
    ),
    "sports": (
        "team coach player goal match season league referee stadium ball striker keeper "
        "tournament medal race sprint marathon court net racket fans final trophy".split(),
        "scores defends trains wins loses passes tackles sprints serves celebrates".split(),
        "fast tired injured confident young veteran aggressive calm loud decisive".split(),
    ),
    "finance": (
        "bank loan interest rate market stock bond investor budget tax profit loss "
        "inflation currency dividend portfolio debt credit fund pension auditor".split(),
        "invests borrows lends saves audits trades hedges pays forecasts reports".split(),
        "volatile stable risky quarterly annual fiscal liquid modest steep cautious".split(),
    ),
    "weather": (
        "storm rain snow wind cloud thunder fog frost heat drought forecast sky hail "
        "breeze flood hurricane temperature season morning evening".split(),
        "falls blows clears gathers drifts freezes warms floods howls lingers".split(),
        "cold humid dry grey heavy gentle sudden bright damp freezing".split(),
    ),
    "travel": (
        "train flight airport hotel passport ticket luggage map station harbor ferry "
        "border tourist guide journey road bridge village city museum beach".split(),
        "departs arrives boards books explores crosses wanders visits returns delays".split(),
        "crowded quiet distant scenic ancient narrow busy cheap late comfortable".split(),
    ),
    "medicine": (
        "doctor nurse patient clinic hospital fever vaccine dose surgery symptom "
        "infection diagnosis pill heart lung blood pressure therapy wound scan".split(),
        "treats examines prescribes recovers heals monitors diagnoses injects rests operates".split(),
        "chronic acute mild severe painful sterile routine urgent stable swollen".split(),
    ),
    "computing": (
        "server database compiler kernel thread memory cache network packet query "
        "function bug patch release processor disk cluster request latency index".split(),
        "compiles crashes caches deploys restarts indexes parses allocates schedules logs".split(),
        "concurrent slow fast distributed encrypted broken stale idle parallel remote".split(),
    ),
    "music": (
        "song band guitar piano drummer singer album concert melody chord rhythm "
        "orchestra violin choir lyrics studio stage tempo note symphony".split(),
        "plays sings records tunes rehearses composes performs hums improvises conducts".split(),
        "loud soft haunting upbeat melancholic live acoustic classical catchy slow".split(),
    ),
    "law": (
        "court judge lawyer jury trial verdict contract witness evidence appeal "
        "statute defendant plaintiff sentence hearing clause license fine".split(),
        "rules argues testifies appeals signs sues settles objects dismisses enforces".split(),
        "guilty binding fair lengthy public sealed unanimous criminal civil formal".split(),
    ),
    "gardening": (
        "garden seed soil root leaf flower rose tulip shovel compost weed hedge "
        "orchard apple pear greenhouse lawn vine moss bee".split(),
        "plants waters prunes blooms sprouts wilts digs harvests grows mulches".split(),
        "green dry fertile wild overgrown fragrant shady sunny young thorny".split(),
    ),
    "astronomy": (
        "star planet telescope galaxy comet orbit moon nebula meteor eclipse "
        "astronaut rocket satellite crater asteroid universe light gravity".split(),
        "orbits shines collapses explodes rotates launches observes drifts flares dims".split(),
        "distant bright faint massive icy red ancient cosmic dark rapid".split(),
    ),
    "history": (
        "empire king queen war treaty castle revolution army republic manuscript "
        "dynasty monument ruin battle colony archive chronicle tribe fortress".split(),
        "conquers rules signs falls rebels builds records defends collapses unites".split(),
        "medieval ancient royal bloody forgotten colonial famous lost sacred rival".split(),
    ),
}

FILLER = "the a this that every one another".split()
CONNECT = "and but while because although so then yet".split()
SUBJECTS = ["she", "he", "they", "we", "our neighbour", "the old man", "my sister", "the committee"]


def phrase(rng, topic):
    nouns, verbs, adjs = TOPICS[topic]
    return f"{rng.choice(FILLER)} {rng.choice(adjs)} {rng.choice(nouns)}"


def clause(rng, topic):
    nouns, verbs, adjs = TOPICS[topic]
    forms = [
        lambda: f"{phrase(rng, topic)} {rng.choice(verbs)} near {phrase(rng, topic)}",
        lambda: f"{rng.choice(SUBJECTS)} said {phrase(rng, topic)} {rng.choice(verbs)}",
        lambda: f"{phrase(rng, topic)} {rng.choice(verbs)} with {rng.choice(nouns)} and {rng.choice(nouns)}",
        lambda: f"after the {rng.choice(nouns)}, {phrase(rng, topic)} {rng.choice(verbs)} again",
    ]
    return rng.choice(forms)()


def sentence(rng, topic):
    clauses = [clause(rng, topic) for _ in range(rng.randint(1, 3))]
    text = f" {rng.choice(CONNECT)} ".join(clauses)
    return text[0].upper() + text[1:] + "."


def make(rng):
    topic = rng.choice(sorted(TOPICS))
    kind = rng.random()
    if kind < 0.25:  # a few words: a query
        nouns, _, adjs = TOPICS[topic]
        words = [rng.choice(adjs), rng.choice(nouns)] + rng.sample(nouns, rng.randint(0, 3))
        return " ".join(words)
    if kind < 0.9:  # one sentence
        return sentence(rng, topic)
    # a paragraph, sometimes drifting into a second topic
    second = rng.choice(sorted(TOPICS)) if rng.random() < 0.3 else topic
    parts = [sentence(rng, topic if i % 2 == 0 else second) for i in range(rng.randint(3, 8))]
    return " ".join(parts)


def main():
    rng = random.Random(SEED)
    seen, out = set(), []
    while len(out) < SENTENCES:
        s = make(rng)
        if s not in seen:
            seen.add(s)
            out.append(s)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "crates", "streampool-nn", "src", "accuracy", "corpus.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print(f"{path}: {len(out)} sentences, {sum(len(s) + 1 for s in out)} bytes")


if __name__ == "__main__":
    main()
