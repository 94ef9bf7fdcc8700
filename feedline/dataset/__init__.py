"""The one lazy :class:`Dataset`, the modules its methods delegate to by role (``plans``,
``collect``, ``outputs``, the fit pass in ``fit``), its readers and the grouped view."""
