"""What only the console refuses (config/errors.py); every other refusal it meets is the apps' own,
shown as it is: on the page as a message, on the socket as {"type": "error", "code", "message"}."""

from config.errors import Refusal


class ConsoleRefusal(Refusal):
    UNKNOWN_ACTION = "unknown_action", 400
