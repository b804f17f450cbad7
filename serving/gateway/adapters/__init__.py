"""LoRA adapters loaded at run time: kept in the key store (`registry`), put on every engine
and kept there as engines come and go (`sync`), managed through the admin API (`admin`)."""
