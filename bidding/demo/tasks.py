"""Example tasks taken from the seeds: AITP's paper pipeline, seed 000's node specialities,
seed 001's executive summary, AITP's image classification. Each does a little real work."""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from typing import Any

import bidding
from bidding.demo.app import app


def _work(seconds: float) -> None:
    # Stand-in for the real job's duration; the results below are computed from the input.
    time.sleep(seconds)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="extraction",
          capability="pdf_text_extraction",
          retry_policy=bidding.RetryPolicy(max_retries=2, backoff="exponential", base_ms=300))
def extract_text(self: Any, paper_pdf_url: str, max_pages: int = 50) -> dict[str, Any]:
    """AITP subtask 1: 'Extract Text from PDF' (the text is derived from the URL here).

    A URL containing "flaky" fails its first attempt, like a download that times out, to show a
    retry: a new auction after 300 ms, on another node.
    """
    _work(0.05)
    if "flaky" in paper_pdf_url and int(getattr(self.request, "bidding_attempt", 1)) == 1:
        raise ConnectionError(f"download of {paper_pdf_url} timed out")
    words = re.findall(r"[a-z]+", paper_pdf_url.lower())
    return {"extracted_text": " ".join(words * 3), "pages": min(max_pages, 3 + len(words))}


@app.task(shared=False, base=bidding.BiddingTask, capability="nlp_analysis")
def analyze_text(text: str) -> dict[str, Any]:
    """AITP subtask 2: 'Analyze Text with NLP': top terms of the text."""
    _work(0.08)
    counts = Counter(w for w in text.split() if len(w) > 3)
    return {"analysis": [w for w, _ in counts.most_common(5)], "tokens": len(text.split())}


@app.task(shared=False, base=bidding.BiddingTask, capability="orchestration")
def aggregate(raw_text: str, nlp_results: list[str]) -> dict[str, Any]:
    """AITP subtask 3: 'Aggregate Results'."""
    _work(0.03)
    return {"hypothesis": f"{' and '.join(nlp_results[:2]) or 'nothing'} matter",
            "methodology": f"term frequency over {len(raw_text.split())} words",
            "results": nlp_results, "limitations": "the text is derived from the URL"}


@app.task(shared=False, base=bidding.BiddingTask,
          task_type="gpu_inference", required_skills=["gpu_inference"],
          affinity=["model:embedder"])
def gpu_inference(prompt: str) -> dict[str, Any]:
    """Seed 000: GPU inference, redfin's speciality."""
    _work(0.12)
    return {"embedding": hashlib.sha256(prompt.encode()).hexdigest()[:16]}


@app.task(shared=False, base=bidding.BiddingTask,
          task_type="database", required_skills=["database", "sql"])
def database_query(sql: str) -> dict[str, Any]:
    """Seed 000: database work, bluefin's speciality. Refuses destructive statements."""
    _work(0.04)
    if re.search(r"\b(drop|truncate)\b", sql, re.IGNORECASE):
        raise PermissionError(f"destructive statement refused: {sql!r}")
    return {"rows": len(sql) % 17, "sql": sql}


@app.task(shared=False, base=bidding.BiddingTask,
          task_type="monitoring", required_skills=["monitoring"])
def monitor_check(host: str) -> dict[str, Any]:
    """Seed 000: a monitoring probe, greenfin's speciality."""
    _work(0.02)
    return {"host": host, "status": "ok" if len(host) % 5 else "degraded"}


@app.task(shared=False, base=bidding.BiddingTask, task_type="edge_development",
          required_skills=["edge_development", "testing"])
def edge_build(target: str) -> dict[str, Any]:
    """Seed 000: an edge build and its tests, sasass's speciality."""
    _work(0.1)
    digest = hashlib.sha256(target.encode()).hexdigest()[:8]
    return {"target": target, "artifact": f"{target}-{digest}"}


@app.task(shared=False, base=bidding.BiddingTask,
          task_type="planning", required_skills=["planning"])
def plan(goal: str) -> dict[str, Any]:
    """Seed 000: planning, tpm's speciality."""
    _work(0.05)
    steps = [s.strip() for s in re.split(r"[,;]| then ", goal) if s.strip()]
    return {"steps": steps, "count": len(steps)}


@app.task(shared=False, base=bidding.BiddingTask, task_type="summarize",
          required_skills=["documentation", "nlp_analysis"])
def summarize(requirement: str) -> str:
    """Seed 001's RFP: 'Summarize quantum computing advances for executives'."""
    _work(0.06)
    words = requirement.split()
    return " ".join(words[: max(3, len(words) // 2)]) + "..."


@app.task(shared=False, base=bidding.BiddingTask, task_type="image_classification",
          required_skills=["image_classification", "gpu_inference"])
def classify_image(image_url: str) -> dict[str, Any]:
    """AITP 7.1's pricing example: image classification at a price per image, best on a GPU
    (redfin has both skills; sasass, with the first only, bids too and scores lower)."""
    _work(0.03)
    labels = ["cat", "dog", "boat", "tree"]
    return {"label": labels[sum(map(ord, image_url)) % len(labels)]}
