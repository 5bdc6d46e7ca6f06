"""Value types shared by every layer. Standard library only; nothing here does I/O."""
