"""Three ordinary Celery tasks, auctioned: each names the skills a node needs to bid on it."""

from collections import Counter

import bidding
from proj.celery import app


@app.task(base=bidding.BiddingTask, task_type="ocr", required_skills=["ocr"])
def read_scan(image_name: str) -> dict[str, object]:
    """Read the text of a scanned page (made up from its name here: no OCR engine needed)."""
    words = image_name.rsplit(".", 1)[0].replace("-", " ").split()
    return {"image": image_name, "text": " ".join(words), "words": len(words)}


@app.task(base=bidding.BiddingTask, task_type="nlp_analysis", required_skills=["nlp_analysis"])
def top_terms(text: str, n: int = 3) -> list[str]:
    """The ``n`` most frequent words of ``text`` longer than three letters."""
    counts = Counter(w.strip(".,;:").lower() for w in text.split() if len(w) > 3)
    return [word for word, _ in counts.most_common(n)]


@app.task(base=bidding.BiddingTask, task_type="summary",
          required_skills=["nlp_analysis", "summarization"])
def summarize(text: str, words: int = 8) -> str:
    """The first ``words`` words of ``text``: a summary by a very impatient reader."""
    head = text.split()[:words]
    return " ".join(head) + (" ..." if len(text.split()) > words else "")
