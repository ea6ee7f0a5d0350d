"""Collection rules for the whole checkout (pytest also runs ``spfuse/``'s doctests).

Modules wrapping an optional dependency are not collected when it is absent,
so their doctests skip instead of failing on the import.
"""
import importlib.util

collect_ignore = [path for path, dep in (("spfuse/torch.py", "torch"),)
                  if importlib.util.find_spec(dep) is None]
