"""The corpus: where a pool's pages come from, read as hostile input.

``read`` turns the files and sitemap URLs an operator already has into a :class:`Corpus`
(``model``), through the CSV/JSONL readers (``tables``) and the sitemap walker (``sitemaps``,
which reads an index on disk and over HTTP (``fetch``) with one walk). ``routes`` sets
per-route intervals and what a route lets a crawler's miss add. ``urlnorm`` is the one spelling
of a URL every part agrees on, and imports nothing but the standard library, so ``lanes serve``
looks snapshots up without loading the readers.

This package imports no module of the pool, the server or a backend; it imports nothing here
either, so that ``engine.corpus.urlnorm`` stays a leaf.
"""
