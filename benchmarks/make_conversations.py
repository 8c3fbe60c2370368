"""Write a JSONL dataset of multi-turn conversations for `speedlimit bench --dataset` (stdout), deterministic for a
seed: each conversation is ``--turns`` user turns of ``--words`` random words, with recorded replies of
``--reply-words`` between them, and a reply length of ``--output-tokens``. Each turn holds the turns before it, so a
server's prefix cache can reuse them (benchmarks/README.md, "llama-server's slots reuse their own prompts").

    python benchmarks/make_conversations.py > conv.jsonl
"""

from __future__ import annotations

import argparse
import json
import random

WORDS = ("alpha beta gamma delta epsilon river mountain cloud stone forest ocean signal vector matrix kernel thread "
         "socket buffer cache memory bandwidth latency token model engine server client request reply window batch "
         "queue slot prefix").split()


def conversations(count: int, turns: int, words: int, reply_words: int, output_tokens: int, seed: int) -> list[dict]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    rows = []
    for _ in range(count):
        chat = [m for _ in range(turns) for m in ({"role": "user", "content": text(words)},
                                                   {"role": "assistant", "content": text(reply_words)})]
        rows.append({"conversation": chat[:-1], "output_tokens": output_tokens})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=8, help="conversations")
    parser.add_argument("--turns", type=int, default=3, help="user turns per conversation")
    parser.add_argument("--words", type=int, default=120, help="words per user turn")
    parser.add_argument("--reply-words", type=int, default=50, help="words per recorded reply")
    parser.add_argument("--output-tokens", type=int, default=32, help="reply length each turn asks for")
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()
    for row in conversations(args.count, args.turns, args.words, args.reply_words, args.output_tokens, args.seed):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
