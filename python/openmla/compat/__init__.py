"""Drop-in replacements for the MLA entry points of other libraries, so that engine code can
switch to openmla by changing an import:

    from openmla.compat.tokenspeed_mla import tokenspeed_mla_decode   # was: from tokenspeed_mla
    from openmla.compat.flash_mla import get_mla_metadata, flash_mla_with_kvcache

Names, argument order, defaults, shapes and return conventions follow the originals (where
they differ from openmla's own API, e.g. FlashMLA's LSE layout and its +inf for empty rows,
the original wins). Each module's docstring lists what it had to interpret and what it does
not support; anything unsupported raises NotImplementedError or ValueError, never a silent
approximation.
"""

from . import flash_mla, tokenspeed_mla

__all__ = ["flash_mla", "tokenspeed_mla"]
