"""The lazy :class:`Dataset`, its readers, grouped view and the fit pass."""
