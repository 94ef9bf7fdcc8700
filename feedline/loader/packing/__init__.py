"""Sequence packing: documents of tokens into rows of exactly ``seq_len`` tokens.

- :mod:`~feedline.loader.packing.spec`: :class:`~feedline.loader.packing.spec.Packing`, what to
  pack and how (``fl.Packing``), checked once;
- :mod:`~feedline.loader.packing.bins`: which piece of which document goes into which row, a
  pure function of the documents' lengths in their order (greedy, first-fit, best-fit);
- :mod:`~feedline.loader.packing.rows`: the rows' arrays (``input_ids``, ``labels``,
  ``position_ids``, ``cu_seqlens`` or a block-diagonal ``attention_mask``);
- :mod:`~feedline.loader.packing.packed_loader`: packed batches over a loader's blocks of
  documents, with a tiny, exact and elastic checkpoint.

Packing is a pure function of the document order: a block of ``buffer_size`` documents (the
loader's order, ``buffer_size`` at a time) becomes rows by itself, so a checkpoint is the
position of the block in the order plus the rows of it already delivered; no token is stored.
"""
