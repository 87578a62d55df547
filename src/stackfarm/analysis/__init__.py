"""Inspect: pure analyses over unpacked wheel trees (ELF/fatbin listings, AST scans), cached by file hash."""
