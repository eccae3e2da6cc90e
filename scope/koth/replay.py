"""Replays of King of the Hill games for people: a GIF per game (one frame per tick) and a viewer page.

``record(teams, seed)`` plays one game between two fixed teams and keeps every tick's positions; ``gif``
draws them (team 0 blue, team 1 red, the hill grey, an out unit hollow, the score on top) and ``page``
writes ``index.html`` listing the GIFs with the teams and the result, ready to be shown to people.
"""
from __future__ import annotations

import html
import os
from typing import Any

import numpy as np

from .game import HILL, N_UNITS, SIZE, TEAM, Games
from .policies import mine


def record(teams: tuple, seed: int = 0) -> dict[str, Any]:
    g = Games(1, seed=seed)
    frames = []
    for t in teams:
        t.reset()
    while not g.done:
        frames.append({"pos": g.pos[0].tolist(), "out": g.out[0].tolist(), "score": g.score[0].tolist(),
                       "tick": g.tick})
        a = np.zeros((1, N_UNITS), dtype=np.int64)
        a[:, mine(0)] = teams[0].act(g, 0)
        a[:, mine(1)] = teams[1].act(g, 1)
        g.step(a)
    frames.append({"pos": g.pos[0].tolist(), "out": g.out[0].tolist(), "score": g.score[0].tolist(), "tick": g.tick})
    return {"teams": [t.name for t in teams], "seed": seed, "frames": frames, "result": float(g.result()[0])}


def gif(rec: dict[str, Any], path: str, cell: int = 24, ms: int = 120) -> str:
    from PIL import Image, ImageDraw

    colors = {0: (40, 90, 200), 1: (200, 50, 50)}
    images = []
    top = 22
    for f in rec["frames"]:
        im = Image.new("RGB", (SIZE * cell, SIZE * cell + top), "white")
        d = ImageDraw.Draw(im)
        d.rectangle([HILL[0] * cell, top + HILL[0] * cell, HILL[1] * cell - 1, top + HILL[1] * cell - 1],
                    fill=(215, 215, 215))
        for i in range(SIZE + 1):
            d.line([(i * cell, top), (i * cell, top + SIZE * cell)], fill=(235, 235, 235))
            d.line([(0, top + i * cell), (SIZE * cell, top + i * cell)], fill=(235, 235, 235))
        for u in range(N_UNITS):
            x, y = f["pos"][u]
            box = [x * cell + 4, top + y * cell + 4, (x + 1) * cell - 4, top + (y + 1) * cell - 4]
            c = colors[int(TEAM[u])]
            d.ellipse(box, outline=c, width=2, fill=None if f["out"][u] else c)
        d.text((4, 4), f"tick {f['tick']}  blue {f['score'][0]} : {f['score'][1]} red", fill=(0, 0, 0))
        images.append(im)
    images[0].save(path, save_all=True, append_images=images[1:], duration=ms, loop=0)
    return path


def page(recs: list[tuple[str, dict[str, Any]]], out: str) -> str:
    """``index.html`` in ``out`` showing each (gif file name, record)."""
    items = []
    for name, rec in recs:
        res = {1.0: "blue won", 0.0: "red won", 0.5: "draw"}[rec["result"]]
        items.append(f"<figure><img src='{html.escape(name)}' alt='replay'><figcaption>blue: "
                     f"{html.escape(rec['teams'][0])}, red: {html.escape(rec['teams'][1])}; seed {rec['seed']}; "
                     f"{res}</figcaption></figure>")
    text = ("<!doctype html><html><head><meta charset='utf-8'><title>King of the Hill replays</title>"
            "<style>body{font-family:sans-serif}figure{display:inline-block;margin:8px}</style></head><body>"
            "<h1>King of the Hill replays</h1>" + "\n".join(items) + "</body></html>")
    path = os.path.join(out, "index.html")
    with open(path, "w") as f:
        f.write(text)
    return path
