"""HPCToolkit sparse database format v4 (meta.db, profile.db, cct.db, trace.db)."""
