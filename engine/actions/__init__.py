"""Every state change that spans apps, one function and one transaction each (in the style of
Zulip's zerver/actions): starting, resuming and ending runs, posting a message, cancelling,
deciding approvals, reconciling writes in doubt."""
