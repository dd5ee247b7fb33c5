"""Remote functions that ship with regency (Monarch's ``monarch.builtins``)."""
