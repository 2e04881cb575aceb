"""Segment retrieval: BM25 (the `bm25s` library) over a KB's segment texts. Torch-free."""
from __future__ import annotations


class BM25Index:
    def __init__(self, texts: list[str]):
        import bm25s

        self._bm25s = bm25s
        self.n = len(texts)
        self.index = bm25s.BM25()
        self.index.index(self._tokenize(texts), show_progress=False)

    def _tokenize(self, texts):
        return self._bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the k best segments, best first (fewer if the KB is smaller)."""
        k = min(k, self.n)
        if k <= 0:
            return []
        docs, scores = self.index.retrieve(self._tokenize([query]), k=k, show_progress=False)
        return [int(d) for d in docs[0]]
