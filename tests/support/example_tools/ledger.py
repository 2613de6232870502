"""Example tools of a deployment (docs/EXTENDING.md): a read and a write against "the ledger", a
stand-in for a payment API — one JSON file per credit in EXAMPLE_LEDGER_DIR, so every process of
the deployment (web, workers) sees the same bookings, and booking the same idempotency key twice
books once."""

import hashlib
import json
import os
import tempfile
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tools_app.models import ToolEffect
from tools_app.registry import Reconciled, Tool, ToolContext, ToolError, tool_register


def ledger_dir() -> Path:
    path = Path(os.environ.get("EXAMPLE_LEDGER_DIR") or Path(tempfile.gettempdir()) / "warden-example-ledger")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _booking_path(idempotency_key: str) -> Path:
    return ledger_dir() / (hashlib.sha256(idempotency_key.encode()).hexdigest() + ".json")


def ledger_bookings() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(ledger_dir().glob("*.json"))]


class AccountArguments(BaseModel):
    # What the model invents beyond the schema is dropped; text is stripped, so " acme" is acme
    # in the stored call and in the business key.
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    account: str = Field(min_length=1, max_length=64, description="The customer account, e.g. \"acme\".")


class CreditArguments(AccountArguments):
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2, description="Amount to credit, e.g. \"150.00\".")
    reference: str = Field(min_length=1, max_length=64, description="The invoice or case the credit settles.")


def ledger_balance(ctx: ToolContext, args: AccountArguments) -> dict:
    credits = [b for b in ledger_bookings() if b["account"] == args.account]
    return {"account": args.account, "balance": str(sum((Decimal(b["amount"]) for b in credits), Decimal("0.00")))}


def ledger_credit(ctx: ToolContext, args: CreditArguments) -> dict:
    if not ctx.idempotency_key:
        raise ToolError("idempotency_key_missing", "refusing to book without an idempotency key")
    booking = {"account": args.account, "amount": str(args.amount), "reference": args.reference, "key": ctx.idempotency_key}
    try:
        # O_EXCL: the booking exists once per key, whoever books it first.
        with open(_booking_path(ctx.idempotency_key), "x") as file:
            json.dump(booking, file)
    except FileExistsError:
        booked = json.loads(_booking_path(ctx.idempotency_key).read_text())
        if booked != booking:
            raise ToolError("idempotency_key_reused", "this key booked a different credit") from None
    return booking


def ledger_credit_reconcile(ctx: ToolContext, args: CreditArguments) -> Reconciled | None:
    """What the ledger booked under our key: the run-time asks when a credit's outcome is unknown."""
    path = _booking_path(ctx.idempotency_key)
    if path.exists():
        return Reconciled(applied=True, result=json.loads(path.read_text()), detail="booking found by idempotency key")
    return Reconciled(applied=False, detail="no booking under this key")


tool_register(Tool(
    name="ledger_balance",
    description="An account's balance in the ledger.",
    arguments=AccountArguments,
    effect=ToolEffect.READ,
    execute=ledger_balance,
    timeout=5.0,
    # The card's line in the console once it answered: a format string over arguments and result.
    summary="Balance of {account}: {balance} EUR",
))
tool_register(Tool(
    name="ledger_credit",
    description="Credit an account in the ledger. Warden asks for the approvals the agent's rules want.",
    arguments=CreditArguments,
    effect=ToolEffect.WRITE,
    execute=ledger_credit,
    reconcile=ledger_credit_reconcile,
    # One credit per account and reference, however often the model asks: the business key.
    business_key=lambda args: f"credit:{args.account}:{args.reference}",
    # What the credit moves, to whom, for what: limits add the amounts up, the desk shows them.
    amount="amount",
    currency="EUR",
    counterparty="account",
    reference="reference",
    # What the customer's console says once the credit went through (the booking's fields).
    summary="Credited {amount} EUR to {account}, ref {reference}",
    timeout=5.0,
))
