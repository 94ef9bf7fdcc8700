"""Weighted mixing of several sources into one stream of batches.

- :mod:`~feedline.loader.mixing.schedule`: which source each position of the mixed stream
  draws from, and which of that source's samples, a pure function of the sources' sizes, the
  weights (and where they changed), the seed and the epoch;
- :mod:`~feedline.loader.mixing.draws_ahead`: those draws computed a chunk of positions at a
  time, vectorised, the next chunk in a background thread;
- :mod:`~feedline.loader.mixing.combined_cache`: the sources' memory caches as one cache;
- :mod:`~feedline.loader.mixing.mixed_loader`: batches of the mixed stream for one rank, with a
  tiny, exact and elastic checkpoint.
"""
