"""The probe's checks: ``compute``, ``collective``, ``memory`` and ``golden``.

Each runs inside one device worker and returns a :class:`~sdcprobe.trace.CheckTrace`;
the parent compares traces across devices and against the baseline.
"""
