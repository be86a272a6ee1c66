"""Export drafters to the formats servers and reference code read, import published ones, print serve commands."""

from flashdraft.export.conventions import CONVENTIONS, LayerConvention
from flashdraft.export.formats import EXPORTERS, ExportError, export_drafter, register_exporter
from flashdraft.export import eagle3  # noqa: F401,E402  (registers the EAGLE-3 family's exporters)
from flashdraft.export.importers import import_drafter
from flashdraft.export import dflash2  # noqa: F401,E402  (registers the DFlash2 family's exporter and importer)
from flashdraft.export.quirks import TargetQuirks, measure_quirks
from flashdraft.export.serve import serve_commands

__all__ = ["CONVENTIONS", "EXPORTERS", "ExportError", "LayerConvention", "TargetQuirks", "export_drafter",
           "import_drafter", "measure_quirks", "register_exporter", "serve_commands"]
