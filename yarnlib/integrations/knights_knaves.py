"""Knights-and-Knaves puzzles and the rule-based reward of the Logic-RL GRPO recipe.

Knights always tell the truth, knaves always lie; each inhabitant makes one statement and
the puzzle is kept only when exactly one knight/knave assignment is consistent with all of
them (checked by trying every assignment). The reward scores the completion's format
(``<think>…</think><answer>…</answer>``) and its answer (all identities right, wrong, or
unparsable), as Logic-RL does.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

NAMES = (
    "Ada", "Basil", "Cora", "Dmitri", "Elena", "Felix", "Greta", "Hugo", "Iris", "Jonas",
    "Kira", "Leon", "Mila", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Viktor",
)  # fmt: skip
MIN_PEOPLE, MAX_PEOPLE = 2, 5
# Logic-RL's scores: format +1 / -1; answer +2 right, -1.5 wrong, -2 unparsable or bad format.
FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSABLE = 2.0, -1.5, -2.0

# A statement is a nested tuple: ("is", person, knight?) or (op, left, right), op in OPS.
OPS = ("and", "or", "if", "iff")


def holds(statement: tuple, world: tuple[bool, ...]) -> bool:
    """Whether ``statement`` is true when ``world[i]`` says person i is a knight."""
    op, a, b = statement
    if op == "is":
        return world[a] == b
    left, right = holds(a, world), holds(b, world)
    return {
        "and": left and right,
        "or": left or right,
        "if": (not left) or right,
        "iff": left == right,
    }[op]


def render(statement: tuple, names: list[str]) -> str:
    op, a, b = statement
    if op == "is":
        return f"{names[a]} is a {'knight' if b else 'knave'}"
    left, right = render(a, names), render(b, names)
    return {
        "and": f"{left} and {right}",
        "or": f"{left} or {right}",
        "if": f"if {left}, then {right}",
        "iff": f"{left} if and only if {right}",
    }[op]


def consistent_worlds(statements: list[tuple]) -> list[tuple[bool, ...]]:
    """Every assignment in which each speaker is a knight exactly when their statement holds."""
    n = len(statements)
    return [
        world
        for world in itertools.product((True, False), repeat=n)
        if all(world[i] == holds(s, world) for i, s in enumerate(statements))
    ]


@dataclass(frozen=True)
class Puzzle:
    names: tuple[str, ...]
    statements: tuple[tuple, ...]
    knights: tuple[bool, ...]  # the unique solution

    def text(self) -> str:
        people = ", ".join(self.names[:-1]) + f" and {self.names[-1]}"
        lines = [
            "On an island every inhabitant is either a knight, who always tells the truth, or a "
            f"knave, who always lies. You meet {len(self.names)} inhabitants: {people}.",
        ]
        for name, statement in zip(self.names, self.statements, strict=True):
            said = render(statement, list(self.names))
            lines.append(f'{name} says: "{said[0].upper()}{said[1:]}."')
        lines.append(
            "Who is a knight and who is a knave? Think inside <think> </think>, then give one "
            "line per inhabitant inside <answer> </answer>, like <answer>(1) Ada is a knight\n"
            "(2) Basil is a knave</answer>."
        )
        return "\n".join(lines)

    def solution_text(self) -> str:
        return "\n".join(
            f"({i}) {name} is a {'knight' if knight else 'knave'}"
            for i, (name, knight) in enumerate(zip(self.names, self.knights, strict=True), 1)
        )


def _random_statement(rng: random.Random, n: int, speaker: int) -> tuple:
    def atom(person: int) -> tuple:
        return ("is", person, rng.random() < 0.5)

    if rng.random() < 0.35:  # a plain claim about someone else
        others = [i for i in range(n) if i != speaker]
        return atom(rng.choice(others))
    first, second = rng.sample(range(n), 2)  # two people: no tautologies like "A or not A"
    return (rng.choice(OPS), atom(first), atom(second))


def make_puzzle(rng: random.Random, people: int) -> Puzzle:
    """A puzzle with ``people`` inhabitants and exactly one solution."""
    if isinstance(people, bool) or not isinstance(people, int):
        raise ValueError(f"people must be an integer in {MIN_PEOPLE}..{MAX_PEOPLE}, got {people!r}")
    if not MIN_PEOPLE <= people <= MAX_PEOPLE:
        raise ValueError(f"people must be in {MIN_PEOPLE}..{MAX_PEOPLE}, got {people}")
    names = tuple(rng.sample(NAMES, people))
    while True:
        statements = [_random_statement(rng, people, i) for i in range(people)]
        worlds = consistent_worlds(statements)
        if len(worlds) == 1:
            return Puzzle(names, tuple(statements), worlds[0])


def make_puzzles(count: int, seed: int) -> list[Puzzle]:
    """``count`` puzzles, 2–5 people cycling, reproducible from ``seed``."""
    rng = random.Random(seed)
    sizes = range(MIN_PEOPLE, MAX_PEOPLE + 1)
    return [make_puzzle(rng, sizes[i % len(sizes)]) for i in range(count)]


def distracted_prompt(
    puzzle: Puzzle, tokenizer, prompt_tokens: int, text_ids: list[int], start: int
) -> str:
    """The puzzle preceded by distractor text (``text_ids`` from ``start`` on), about
    ``prompt_tokens`` tokens in all, so the answer is generated and scored beyond L."""
    question = f"\n\n{puzzle.text()}\nAssistant:"
    room = prompt_tokens - len(tokenizer(question, add_special_tokens=False)["input_ids"])
    if room <= 0 or len(text_ids) < room:
        raise ValueError(
            f"prompt_tokens: {prompt_tokens} leaves {room} tokens for distractor text, which has "
            f"{len(text_ids)}; allowed: more than the puzzle's own tokens, at most the text's"
        )
    start %= len(text_ids) - room + 1
    distractor = tokenizer.decode(text_ids[start : start + room])
    return f"Read this, then solve the puzzle below.\n\n{distractor}{question}"


def make_dataset(tokenizer, count: int, seed: int, prompt_tokens: int, text: str) -> list[dict]:
    """TRL rows: ``prompt`` (distractor text + puzzle) and the reward's ``names``/``knights``."""
    rng = random.Random(seed)
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = []
    for puzzle in make_puzzles(count, seed):
        start = rng.randrange(1 << 30)
        prompt = distracted_prompt(puzzle, tokenizer, prompt_tokens, text_ids, start)
        rows.append(
            {"prompt": prompt, "names": list(puzzle.names), "knights": list(puzzle.knights)}
        )
    return rows


# -- the reward ----------------------------------------------------------------------------------

FORMAT = re.compile(
    r"^\s*<think>(?:(?!<think>|</think>).)*</think>\s*<answer>(.*?)</answer>\s*$", re.S
)


def format_ok(completion: str) -> bool:
    """One <think> block, then one <answer> block, nothing else around them."""
    return FORMAT.match(completion) is not None and completion.count("<answer>") == 1


def parse_answer(completion: str, names: list[str]) -> list[bool] | None:
    """Each name's identity as the answer block states it; None when any name is missing or
    stated twice with different identities."""
    match = FORMAT.match(completion)
    if match is None:
        return None
    found: list[bool] = []
    for name in names:
        said = set(re.findall(rf"\b{re.escape(name)} is an? (knight|knave)\b", match.group(1)))
        if len(said) != 1:
            return None
        found.append(said.pop() == "knight")
    return found


def format_reward(completions: list[str], **_) -> list[float]:
    """TRL reward function: +1 for the format, -1 otherwise."""
    return [FORMAT_OK if format_ok(c) else FORMAT_BAD for c in completions]


def answer_reward(completions: list[str], names: list, knights: list, **_) -> list[float]:
    """TRL reward function: +2 all identities right, -1.5 wrong, -2 unparsable."""
    scores = []
    for completion, who, truth in zip(completions, names, knights, strict=True):
        stated = parse_answer(completion, list(who)) if format_ok(completion) else None
        if stated is None:
            scores.append(ANSWER_UNPARSABLE)
        else:
            scores.append(ANSWER_RIGHT if stated == list(truth) else ANSWER_WRONG)
    return scores
