"""The tools of the tau2-bench retail and airline domains, written for this project.

Names, arguments, database effects and error conditions follow tau2-bench. A tool raises
``ToolError`` with a message for any refused call; the environment shows that message to the agent.
Each tool is declared with a JSON schema (shown to the agent) and a kind: read, write or generic.
"""
from __future__ import annotations

import ast
import copy
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from .db import OverlayDB


class ToolError(ValueError):
    pass


@dataclass
class Tool:
    name: str
    kind: str  # read | write | generic
    description: str
    params: dict[str, Any]  # JSON schema "properties"
    required: list[str]
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """The JSON schema shown to the agent (without scope's own checking hints)."""
        def shown(x):
            if isinstance(x, dict):
                return {k: shown(v) for k, v in x.items() if k != "whole"}
            return [shown(v) for v in x] if isinstance(x, list) else x

        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": shown(self.params), "required": self.required}}


S = {"type": "string"}
LS = {"type": "array", "items": {"type": "string"}}


MAX_EXPRESSION = 10_000
MAX_POWER_DIGITS = 400  # a power whose result would have more digits than this is refused


def _safe_eval(node: ast.AST) -> float | int:
    """Numbers, + - * / ** and parentheses, evaluated as Python would, but bounded: a power that would
    take long to compute (``9**9**9``) is refused before it is computed."""
    if isinstance(node, ast.Expression):
        return _safe_eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _safe_eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        x, y = _safe_eval(node.left), _safe_eval(node.right)
        if isinstance(node.op, ast.Pow):
            if isinstance(y, int) and abs(x) > 1 and y * math.log10(abs(x)) > MAX_POWER_DIGITS:
                raise OverflowError("result too large")
            return x ** y
        if isinstance(node.op, ast.Mult) and isinstance(x, int) and isinstance(y, int) and \
                x.bit_length() + y.bit_length() > 4 * MAX_POWER_DIGITS:
            raise OverflowError("result too large")
        return {ast.Add: lambda: x + y, ast.Sub: lambda: x - y, ast.Mult: lambda: x * y,
                ast.Div: lambda: x / y}[type(node.op)]()
    raise SyntaxError("invalid syntax")


def _calculate(db, expression: str) -> str:
    """tau2's calculator (digits, + - * / . parentheses and spaces; ``**`` is two of its characters), its
    result rounded to 2 places; refused in bounded time where the expression is too long or too large."""
    if not all(c in "0123456789+-*/(). " for c in expression):
        raise ToolError("Invalid characters in expression")
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        value = _safe_eval(ast.parse(expression.strip(), mode="eval"))
        return str(round(float(value), 2))
    except (SyntaxError, ArithmeticError, ValueError, RecursionError, MemoryError) as e:
        raise ToolError(str(e) or type(e).__name__) from None


def _transfer(db, summary: str) -> str:
    return "Transfer successful"


def _r2(x: float) -> float:
    return round(x, 2)


# ---- retail ---------------------------------------------------------------------------------------
ORDER_OPTIONAL = ("cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
                  "exchange_price_difference", "return_items", "return_payment_method_id")


def _order_view(order: dict) -> dict:
    """An order as tau2 returns it: its optional fields present, null when unset."""
    return {**{k: None for k in ORDER_OPTIONAL}, **order}


def _order(db: OverlayDB, order_id: str, write: bool = False) -> dict:
    if not db.has("orders", order_id):
        raise ToolError("Order not found")
    return db.mut("orders", order_id) if write else db.get("orders", order_id)


def _user(db: OverlayDB, user_id: str, write: bool = False) -> dict:
    if not db.has("users", user_id):
        raise ToolError("User not found")
    return db.mut("users", user_id) if write else db.get("users", user_id)


def _variant(db: OverlayDB, product_id: str, item_id: str) -> dict:
    if not db.has("products", product_id):
        raise ToolError("Product not found")
    v = db.get("products", product_id)["variants"].get(item_id)
    if v is None:
        raise ToolError("Variant not found")
    return v


def _retail_payment(db: OverlayDB, user_id: str, pm_id: str, write: bool = False) -> dict:
    user = _user(db, user_id, write)
    if pm_id not in user["payment_methods"]:
        raise ToolError("Payment method not found")
    return user["payment_methods"][pm_id]


def _check_items(order: dict, item_ids: list[str], msg: Callable[[str], str]) -> None:
    all_ids = [it["item_id"] for it in order["items"]]
    for i in item_ids:
        if item_ids.count(i) > all_ids.count(i):
            raise ToolError(msg(i))


def _price_diff(db: OverlayDB, order: dict, item_ids, new_item_ids, forbid_same: bool,
                count_msg: str) -> tuple[float, list]:
    """The summed price difference (unrounded) and the new variants, checked as tau2 checks them."""
    if len(item_ids) != len(new_item_ids):
        raise ToolError(count_msg)
    diff, variants = 0, []
    for old, new in zip(item_ids, new_item_ids):
        if forbid_same and old == new:
            raise ToolError("The new item id should be different from the old item id")
        item = next((it for it in order["items"] if it["item_id"] == old), None)
        if item is None:
            raise ToolError(f"Item {old} not found")
        v = _variant(db, item["product_id"], new)
        if not v["available"]:
            raise ToolError(f"New item {new} not found or available")
        diff += v["price"] - item["price"]
        variants.append(v)
    return diff, variants


def r_cancel_pending_order(db, order_id: str, reason: str):
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be cancelled")
    if reason not in ("no longer needed", "ordered by mistake"):
        raise ToolError("Invalid reason")
    order = _order(db, order_id, write=True)
    refunds = []
    for p in order["payment_history"]:
        refunds.append({"transaction_type": "refund", "amount": p["amount"], "payment_method_id": p["payment_method_id"]})
        pm = _retail_payment(db, order["user_id"], p["payment_method_id"])
        if pm["source"] == "gift_card":
            pm = _retail_payment(db, order["user_id"], p["payment_method_id"], write=True)
            pm["balance"] = _r2(pm["balance"] + p["amount"])
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return order


def _validate_swap(db, order_id, item_ids, new_item_ids, payment_method_id, status: str, status_msg: str,
                   count_msg, forbid_same: bool, balance_msg: str, length_msg: str, round_diff: bool):
    """The checks shared by exchanging delivered items and modifying pending ones."""
    order = _order(db, order_id)
    if order["status"] != status:
        raise ToolError(status_msg)
    _check_items(order, item_ids, count_msg)
    diff, variants = _price_diff(db, order, item_ids, new_item_ids, forbid_same, length_msg)
    if round_diff:
        diff = _r2(diff)
    pm = _retail_payment(db, order["user_id"], payment_method_id)
    if pm["source"] == "gift_card" and pm["balance"] < diff:
        raise ToolError(balance_msg)
    return diff, variants, pm


def r_exchange_delivered_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    diff, _, _ = _validate_swap(
        db, order_id, item_ids, new_item_ids, payment_method_id, "delivered", "Non-delivered order cannot be exchanged",
        lambda i: f"Number of {i} not found.", False, "Insufficient gift card balance to pay for the price difference",
        "The number of items to be exchanged should match.", round_diff=True)
    order = _order(db, order_id, write=True)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return _order_view(order)


def r_find_user_id_by_name_zip(db, first_name: str, last_name: str, zip: str):
    f, l_ = first_name.lower(), last_name.lower()
    for uid, u in db.items("users"):
        if u["name"]["first_name"].lower() == f and u["name"]["last_name"].lower() == l_ \
                and u["address"]["zip"] == zip:
            return uid
    raise ToolError("User not found")


def r_find_user_id_by_email(db, email: str):
    e = email.lower()
    for uid, u in db.items("users"):
        if u["email"].lower() == e:
            return uid
    raise ToolError("User not found")


def r_get_order_details(db, order_id: str):
    return _order_view(_order(db, order_id))


def r_get_product_details(db, product_id: str):
    if not db.has("products", product_id):
        raise ToolError("Product not found")
    return db.get("products", product_id)


def r_get_user_details(db, user_id: str):
    return _user(db, user_id)


def r_list_all_product_types(db):
    return json.dumps({p["name"]: p["product_id"] for _, p in db.items("products")}, sort_keys=True)


def _address(address1, address2, city, state, country, zip):
    return {"address1": address1, "address2": address2, "city": city, "country": country, "state": state, "zip": zip}


def r_modify_pending_order_address(db, order_id: str, address1: str, address2: str, city: str, state: str,
                                   country: str, zip: str):
    if "pending" not in _order(db, order_id)["status"]:
        raise ToolError("Non-pending order cannot be modified")
    order = _order(db, order_id, write=True)
    order["address"] = _address(address1, address2, city, state, country, zip)
    return _order_view(order)


def r_modify_pending_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    """As tau2 does it, quirks included unless the database says otherwise (``db.upstream_quirks``): the
    price difference is not rounded, and every modified item takes the price and options of the last
    new item (tau2 reuses the last variant of its check loop)."""
    quirks = db.upstream_quirks
    diff, variants, pm = _validate_swap(
        db, order_id, item_ids, new_item_ids, payment_method_id, "pending", "Non-pending order cannot be modified",
        lambda i: f"{i} not found", True, "Insufficient gift card balance to pay for the new item",
        "The number of items to be exchanged should match", round_diff=not quirks)
    order = _order(db, order_id, write=True)
    order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund", "amount": abs(diff),
                                     "payment_method_id": payment_method_id})
    if pm["source"] == "gift_card":
        pm = _retail_payment(db, order["user_id"], payment_method_id, write=True)
        pm["balance"] = _r2(pm["balance"] - diff)
    for old, new, v in zip(item_ids, new_item_ids, variants):
        item = next(it for it in order["items"] if it["item_id"] == old)
        src = variants[-1] if quirks else v
        item["item_id"], item["price"], item["options"] = new, src["price"], dict(src["options"])
    order["status"] = "pending (item modified)"
    return _order_view(order)


def r_modify_pending_order_payment(db, order_id: str, payment_method_id: str):
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    pm = _retail_payment(db, order["user_id"], payment_method_id)
    ph = order["payment_history"]
    if len(ph) != 1 or ph[0]["transaction_type"] != "payment":
        raise ToolError("There should be exactly one payment for a pending order")
    if ph[0]["payment_method_id"] == payment_method_id:
        raise ToolError("The new payment method should be different from the current one")
    amount = ph[0]["amount"]
    if pm["source"] == "gift_card" and pm["balance"] < amount:
        raise ToolError("Insufficient gift card balance to pay for the order")
    order = _order(db, order_id, write=True)
    old_id = order["payment_history"][0]["payment_method_id"]
    order["payment_history"].extend([
        {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
        {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id}])
    if pm["source"] == "gift_card":
        pm = _retail_payment(db, order["user_id"], payment_method_id, write=True)
        pm["balance"] = _r2(pm["balance"] - amount)
    old = _retail_payment(db, order["user_id"], old_id)
    if old["source"] == "gift_card":
        old = _retail_payment(db, order["user_id"], old_id, write=True)
        old["balance"] = _r2(old["balance"] + amount)
    return _order_view(order)


def r_modify_user_address(db, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                          zip: str):
    user = _user(db, user_id, write=True)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def r_return_delivered_order_items(db, order_id: str, item_ids: list, payment_method_id: str):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be returned")
    pm = _retail_payment(db, order["user_id"], payment_method_id)
    if pm["source"] != "gift_card" and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ToolError("Payment method should be the original payment method")
    _check_items(order, item_ids, lambda i: "Some item not found")
    order = _order(db, order_id, write=True)
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return _order_view(order)


ORDER_ID = {"type": "string", "description": "The order id, such as '#W0000000' (note the leading '#')."}
ADDR = {"address1": S, "address2": S, "city": S, "state": S, "country": S, "zip": S}
ADDR_REQ = ["address1", "address2", "city", "state", "country", "zip"]

PM_ID = {"type": "string", "description": "A payment method id of the user, such as 'gift_card_0000000' or "
                                         "'credit_card_0000000' (see the user's or the order's details)."}
ITEMS = {"type": "array", "items": S, "description": "Item ids, such as '1008292230'; an item ordered twice is "
                                                     "listed twice."}
NEW_ITEMS = {"type": "array", "items": S, "description": "The new item ids, in the same order: each one of the same "
                                                         "product as the item id in the same position."}

RETAIL_TOOLS = [
    Tool("calculate", "generic", "Calculate a mathematical expression (numbers, + - * / and parentheses), rounded "
         "to 2 decimal places.", {"expression": S}, ["expression"], _calculate),
    Tool("cancel_pending_order", "write", "Cancel a pending order; reason is 'no longer needed' or 'ordered by "
         "mistake'. Payments are refunded: to a gift card at once, to other methods in 5-7 business days. Explain "
         "the cancellation and get the user's explicit confirmation (yes) first.",
         {"order_id": ORDER_ID, "reason": S}, ["order_id", "reason"], r_cancel_pending_order),
    Tool("exchange_delivered_order_items", "write", "Exchange items of a delivered order for other items of the same "
         "product. A delivered order can be returned or exchanged only once, so put every item in one call. The "
         "payment method pays or receives the price difference. Explain the exchange and get the user's explicit "
         "confirmation (yes) first.",
         {"order_id": ORDER_ID, "item_ids": ITEMS, "new_item_ids": NEW_ITEMS, "payment_method_id": PM_ID},
         ["order_id", "item_ids", "new_item_ids", "payment_method_id"], r_exchange_delivered_order_items),
    Tool("find_user_id_by_name_zip", "read", "Find a user id by first name, last name and zip code. Look users up "
         "by email first; use this only when the user is not found by email or does not remember it.",
         {"first_name": S, "last_name": S, "zip": S}, ["first_name", "last_name", "zip"], r_find_user_id_by_name_zip),
    Tool("find_user_id_by_email", "read", "Find a user id by email.", {"email": S}, ["email"],
         r_find_user_id_by_email),
    Tool("get_order_details", "read", "Get the status and details of an order.", {"order_id": ORDER_ID},
         ["order_id"], r_get_order_details),
    Tool("get_product_details", "read", "Get the inventory details of a product and its variants (a product id, "
         "not an item id).", {"product_id": S}, ["product_id"], r_get_product_details),
    Tool("get_user_details", "read", "Get the details of a user, including their orders.", {"user_id": S},
         ["user_id"], r_get_user_details),
    Tool("list_all_product_types", "read", "List the name and product id of all 50 product types.", {}, [],
         r_list_all_product_types),
    Tool("modify_pending_order_address", "write", "Modify the shipping address of a pending order. Explain the "
         "change and get the user's explicit confirmation (yes) first.", {"order_id": ORDER_ID, **ADDR},
         ["order_id"] + ADDR_REQ, r_modify_pending_order_address),
    Tool("modify_pending_order_items", "write", "Modify items of a pending order to other items of the same "
         "product. This can be done only once per order, so put every item in one call. The payment method pays "
         "or receives the price difference. Explain the change and get the user's explicit confirmation (yes) first.",
         {"order_id": ORDER_ID, "item_ids": ITEMS, "new_item_ids": NEW_ITEMS, "payment_method_id": PM_ID},
         ["order_id", "item_ids", "new_item_ids", "payment_method_id"], r_modify_pending_order_items),
    Tool("modify_pending_order_payment", "write", "Modify the payment method of a pending order. Explain the "
         "change and get the user's explicit confirmation (yes) first.", {"order_id": ORDER_ID,
                                                                           "payment_method_id": PM_ID},
         ["order_id", "payment_method_id"], r_modify_pending_order_payment),
    Tool("modify_user_address", "write", "Modify the default address of a user. Explain the change and get the "
         "user's explicit confirmation (yes) first.", {"user_id": S, **ADDR}, ["user_id"] + ADDR_REQ,
         r_modify_user_address),
    Tool("return_delivered_order_items", "write", "Return items of a delivered order. The refund goes to the "
         "original payment method or to an existing gift card. A delivered order can be returned or exchanged "
         "only once, so put every item in one call. Explain the return and get the user's explicit confirmation "
         "(yes) first.", {"order_id": ORDER_ID, "item_ids": ITEMS, "payment_method_id": PM_ID},
         ["order_id", "item_ids", "payment_method_id"], r_return_delivered_order_items),
    Tool("transfer_to_human_agents", "generic", "Transfer the user to a human agent with a summary of their issue. "
         "Only if the user explicitly asks for a human agent, or the issue cannot be solved with the tools and the "
         "policy.", {"summary": S}, ["summary"], _transfer),
]


# ---- airline --------------------------------------------------------------------------------------
NOW = "2024-05-15T15:00:00"
AIRPORTS = [("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
            ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
            ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
            ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
            ("PHL", "Philadelphia"), ("LGA", "LaGuardia")]


def _key(db: OverlayDB, table: str, key: str, what: str) -> str:
    """The key itself, if the table has it (matched exactly, as tau2 does)."""
    if db.has(table, key):
        return key
    raise ToolError(f"{what} {key} not found")


def _res_view(res: dict) -> dict:
    """A reservation as tau2 returns it: ``status`` present, null when unset."""
    return {"status": None, **res}


def _a_user(db, user_id, write=False):
    k = _key(db, "users", user_id, "User")
    return k, (db.mut("users", k) if write else db.get("users", k))


def _a_res(db, reservation_id, write=False):
    k = _key(db, "reservations", reservation_id, "Reservation")
    return k, (db.mut("reservations", k) if write else db.get("reservations", k))


def _flight_date(db, flight_number, date, write=False):
    k = _key(db, "flights", flight_number, "Flight")
    f = db.mut("flights", k) if write else db.get("flights", k)
    if date not in f["dates"]:
        raise ToolError(f"Flight {flight_number} not found on date {date}")
    return k, f, f["dates"][date]


def _search(db, date, origin=None, destination=None, leave_after=None) -> list[dict]:
    out = []
    for _, f in db.items("flights"):
        d = f["dates"].get(date)
        if d is None or d["status"] != "available":
            continue
        if origin is not None and f["origin"] != origin or destination is not None and f["destination"] != destination:
            continue
        if leave_after is not None and f["scheduled_departure_time_est"] < leave_after:
            continue
        out.append({"flight_number": f["flight_number"], "origin": f["origin"], "destination": f["destination"],
                    "status": "available", "scheduled_departure_time_est": f["scheduled_departure_time_est"],
                    "scheduled_arrival_time_est": f["scheduled_arrival_time_est"], "date": None,
                    "available_seats": d["available_seats"], "prices": d["prices"]})
    return out


def _pay_for_update(user: dict, payment_id: str, total: int) -> dict | None:
    if payment_id not in user["payment_methods"]:
        raise ToolError("Payment method not found")
    pm = user["payment_methods"][payment_id]
    if pm["source"] == "certificate":
        raise ToolError("Certificate cannot be used to update reservation")
    if pm["source"] == "gift_card" and pm["amount"] < total:
        raise ToolError("Gift card balance is not enough")
    if pm["source"] == "gift_card":
        pm["amount"] -= total
    return {"payment_id": payment_id, "amount": total} if total != 0 else None


CABINS = ("basic_economy", "economy", "business")


def a_book_reservation(db, user_id, origin, destination, flight_type, cabin, flights, passengers, payment_methods,
                       total_baggages, nonfree_baggages, insurance):
    uid, user = _a_user(db, user_id)
    rid = next((r for r in ("HATHAT", "HATHAU", "HATHAV") if not db.has("reservations", r)), None)
    if rid is None:
        raise ToolError("Too many reservations")
    total, res_flights, legs = 0, [], []
    for fi in flights:
        fk, f, d = _flight_date(db, fi["flight_number"], fi["date"])
        if d["status"] != "available":
            raise ToolError(f"Flight {fk} not available on date {fi['date']}")
        if d["available_seats"][cabin] < len(passengers):
            raise ToolError(f"Not enough seats on flight {fk}")
        price = d["prices"][cabin]
        res_flights.append({"origin": f["origin"], "destination": f["destination"], "flight_number": fk,
                            "date": fi["date"], "price": price})
        legs.append((fk, fi["date"]))
        total += price * len(passengers)
    if insurance == "yes":
        total += 30 * len(passengers)
    total += 50 * nonfree_baggages
    for p in payment_methods:
        if p["payment_id"] not in user["payment_methods"]:
            raise ToolError(f"Payment method {p['payment_id']} not found")
        pm = user["payment_methods"][p["payment_id"]]
        if pm["source"] in ("gift_card", "certificate") and pm["amount"] < p["amount"]:
            raise ToolError(f"Not enough balance in payment method {p['payment_id']}")
    paid = sum(p["amount"] for p in payment_methods)
    if paid != total:
        raise ToolError(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    _, user = _a_user(db, uid, write=True)
    for p in payment_methods:
        pm = user["payment_methods"][p["payment_id"]]
        if pm["source"] == "gift_card":
            pm["amount"] -= p["amount"]
        elif pm["source"] == "certificate":
            if p["payment_id"] not in user["payment_methods"]:
                raise ToolError(f"Certificate {p['payment_id']} was used twice")
            user["payment_methods"].pop(p["payment_id"])
    for fk, date in legs:
        _, _, d = _flight_date(db, fk, date, write=True)
        d["available_seats"][cabin] -= len(passengers)
    res = {"reservation_id": rid, "user_id": uid, "origin": origin, "destination": destination,
           "flight_type": flight_type, "cabin": cabin, "flights": res_flights,
           "passengers": [dict(p) for p in passengers],
           "payment_history": [dict(p) for p in payment_methods], "created_at": NOW,
           "total_baggages": total_baggages, "nonfree_baggages": nonfree_baggages, "insurance": insurance}
    db.put("reservations", rid, res)
    user["reservations"].append(rid)
    return _res_view(res)


def a_cancel_reservation(db, reservation_id):
    _, res = _a_res(db, reservation_id, write=True)
    res["payment_history"].extend([{"payment_id": p["payment_id"], "amount": -p["amount"]}
                                   for p in list(res["payment_history"])])
    res["status"] = "cancelled"
    return _res_view(res)


def a_get_reservation_details(db, reservation_id):
    return _res_view(_a_res(db, reservation_id)[1])


def a_get_user_details(db, user_id):
    return _a_user(db, user_id)[1]


def a_list_all_airports(db):
    return [{"iata": c, "city": n} for c, n in AIRPORTS]


def a_search_direct_flight(db, origin, destination, date):
    return _search(db, date, origin, destination)


def a_search_onestop_flight(db, origin, destination, date):
    out = []
    for r1 in _search(db, date, origin, None):
        r1 = dict(r1, date=date)
        date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in r1["scheduled_arrival_time_est"] else date
        for r2 in _search(db, date2, r1["destination"], destination, r1["scheduled_arrival_time_est"]):
            out.append([r1, dict(r2, date=date2)])
    return out


def a_send_certificate(db, user_id, amount):
    uid, user = _a_user(db, user_id, write=True)
    for pid in ("certificate_3221322", "certificate_3221323", "certificate_3221324"):
        if pid not in user["payment_methods"]:
            user["payment_methods"][pid] = {"id": pid, "amount": float(amount), "source": "certificate"}
            return f"Certificate {pid} added to user {user_id} with amount {amount}."
    raise ToolError("Too many certificates")


def _charge_update(db, reservation_key: str, payment_id: str, total: int) -> dict:
    """Charge (or refund) an update to a reservation; return the reservation, ready to modify.
    Nothing changes if the payment is refused (an unmodified copy does not count as a change)."""
    res = db.get("reservations", reservation_key)
    _, user = _a_user(db, res["user_id"], write=True)
    payment = _pay_for_update(user, payment_id, total)
    _, res = _a_res(db, reservation_key, write=True)
    if payment is not None:
        res["payment_history"].append(payment)
    return res


def a_update_reservation_baggages(db, reservation_id, total_baggages, nonfree_baggages, payment_id):
    rk, res = _a_res(db, reservation_id)
    res = _charge_update(db, rk, payment_id, 50 * max(0, nonfree_baggages - res["nonfree_baggages"]))
    res["total_baggages"], res["nonfree_baggages"] = total_baggages, nonfree_baggages
    return _res_view(res)


def a_update_reservation_flights(db, reservation_id, cabin, flights, payment_id):
    rk, res = _a_res(db, reservation_id)
    n = len(res["passengers"])
    total, new_flights = 0, []
    for fi in flights:
        fk = _key(db, "flights", fi["flight_number"], "Flight")
        same = next((rf for rf in res["flights"] if rf["flight_number"] == fk and rf["date"] == fi["date"]
                     and cabin == res["cabin"]), None)
        if same is not None:
            total += same["price"] * n
            new_flights.append(dict(same))
            continue
        _, f, d = _flight_date(db, fk, fi["date"])
        if d["status"] != "available":
            raise ToolError(f"Flight {fk} not available on date {fi['date']}")
        if d["available_seats"][cabin] < n:
            raise ToolError(f"Not enough seats on flight {fk}")
        new_flights.append({"flight_number": fk, "date": fi["date"], "price": d["prices"][cabin],
                            "origin": f["origin"], "destination": f["destination"]})
        total += d["prices"][cabin] * n
    total -= sum(rf["price"] for rf in res["flights"]) * n
    res = _charge_update(db, rk, payment_id, total)
    res["flights"], res["cabin"] = new_flights, cabin
    return _res_view(res)


def a_update_reservation_passengers(db, reservation_id, passengers):
    rk, res = _a_res(db, reservation_id)
    if len(passengers) != len(res["passengers"]):
        raise ToolError("Number of passengers does not match")
    _, res = _a_res(db, rk, write=True)
    res["passengers"] = [dict(p) for p in passengers]
    return _res_view(res)


def a_get_flight_status(db, flight_number, date):
    return _flight_date(db, flight_number, date)[2]["status"]


FLIGHTS = {"type": "array", "items": {"type": "object", "properties": {"flight_number": S, "date": S},
                                      "required": ["flight_number", "date"]}}
PASSENGERS = {"type": "array", "items": {"type": "object", "properties": {"first_name": S, "last_name": S, "dob": S},
                                         "required": ["first_name", "last_name", "dob"]}}
COUNT = {"type": "integer", "minimum": 0}
STRICT_COUNT = {"type": "integer", "minimum": 0, "whole": True}
"""tau2 stores update_reservation_baggages' counts as given (2.0 stays a float and fails the DB check),
while book_reservation's model makes 2.0 an int: scope refuses a float there, and so grades it as tau2."""
PAYMENTS = {"type": "array", "items": {"type": "object", "properties": {"payment_id": S, "amount": COUNT},
                                       "required": ["payment_id", "amount"]}}
CABIN = {"type": "string", "enum": list(CABINS)}

AIRLINE_TOOLS = [
    Tool("book_reservation", "write", "Book a reservation. Ask the user for explicit confirmation first.",
         {"user_id": S, "origin": S, "destination": S, "flight_type": {"type": "string", "enum": ["one_way", "round_trip"]},
          "cabin": CABIN, "flights": FLIGHTS, "passengers": PASSENGERS, "payment_methods": PAYMENTS,
          "total_baggages": COUNT, "nonfree_baggages": COUNT, "insurance": {"type": "string", "enum": ["yes", "no"]}},
         ["user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers", "payment_methods",
          "total_baggages", "nonfree_baggages", "insurance"], a_book_reservation),
    Tool("calculate", "generic", "Calculate a mathematical expression (numbers, + - * / and parentheses).",
         {"expression": S}, ["expression"], _calculate),
    Tool("cancel_reservation", "write", "Cancel the whole reservation. Ask the user for explicit confirmation "
         "first.", {"reservation_id": S}, ["reservation_id"], a_cancel_reservation),
    Tool("get_reservation_details", "read", "Get the details of a reservation.", {"reservation_id": S},
         ["reservation_id"], a_get_reservation_details),
    Tool("get_user_details", "read", "Get the details of a user, including their reservations.", {"user_id": S},
         ["user_id"], a_get_user_details),
    Tool("list_all_airports", "read", "List all available airports.", {}, [], a_list_all_airports),
    Tool("search_direct_flight", "read", "Search direct flights between two airports on a date (YYYY-MM-DD).",
         {"origin": S, "destination": S, "date": S}, ["origin", "destination", "date"], a_search_direct_flight),
    Tool("search_onestop_flight", "read", "Search one-stop flights between two airports on a date (YYYY-MM-DD).",
         {"origin": S, "destination": S, "date": S}, ["origin", "destination", "date"], a_search_onestop_flight),
    Tool("send_certificate", "write", "Send a certificate of the given amount to a user. Be careful!",
         {"user_id": S, "amount": {"type": "number", "minimum": 0}}, ["user_id", "amount"], a_send_certificate),
    Tool("transfer_to_human_agents", "generic", "Transfer the user to a human agent with a summary. Only if the "
         "user asks for one or the issue cannot be solved with the tools and policy.", {"summary": S}, ["summary"],
         _transfer),
    Tool("update_reservation_baggages", "write", "Update the baggage numbers of a reservation. Ask the user for "
         "explicit confirmation first.", {"reservation_id": S, "total_baggages": STRICT_COUNT,
                                          "nonfree_baggages": STRICT_COUNT,
                                          "payment_id": S},
         ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"], a_update_reservation_baggages),
    Tool("update_reservation_flights", "write", "Update the flights of a reservation: give every flight of the "
         "new reservation, changed or not. Ask the user for explicit confirmation first.",
         {"reservation_id": S, "cabin": CABIN, "flights": FLIGHTS, "payment_id": S},
         ["reservation_id", "cabin", "flights", "payment_id"], a_update_reservation_flights),
    Tool("update_reservation_passengers", "write", "Update the passengers of a reservation (same number). Ask the "
         "user for explicit confirmation first.", {"reservation_id": S, "passengers": PASSENGERS},
         ["reservation_id", "passengers"], a_update_reservation_passengers),
    Tool("get_flight_status", "read", "Get the status of a flight on a date.", {"flight_number": S, "date": S},
         ["flight_number", "date"], a_get_flight_status),
]

DOMAINS = {"retail": {t.name: t for t in RETAIL_TOOLS}, "airline": {t.name: t for t in AIRLINE_TOOLS}}


def _typename(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def check_value(v: Any, schema: dict[str, Any], where: str) -> Any:
    """``v`` checked against a tool's JSON schema and made canonical, as tau2's typed tools make it
    (an integral float is an int, a certificate amount a float, unknown keys of an object dropped).
    Stricter than pydantic's lax mode where a wrong value would otherwise be written: null, a bool or a
    numeric string where a number belongs, and a negative amount or count, are errors."""
    t = schema.get("type")
    if t == "string":
        if not isinstance(v, str):
            raise ToolError(f"{where}: expected a string, got {_typename(v)}")
    elif t in ("integer", "number"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise ToolError(f"{where}: expected a number, got {_typename(v)} {v!r}"[:200])
        if t == "integer":
            if isinstance(v, float) and (schema.get("whole") or not v.is_integer()):
                raise ToolError(f"{where}: expected a whole number, got {v!r}")
            v = int(v)
        else:
            v = float(v)
        if "minimum" in schema and v < schema["minimum"]:
            raise ToolError(f"{where}: must be at least {schema['minimum']}, got {v!r}")
    elif t == "array":
        if not isinstance(v, list):
            raise ToolError(f"{where}: expected a list, got {_typename(v)}")
        v = [check_value(x, schema.get("items", {}), f"{where}[{i}]") for i, x in enumerate(v)]
    elif t == "object":
        if not isinstance(v, dict):
            raise ToolError(f"{where}: expected an object, got {_typename(v)}")
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in v]
        if missing:
            raise ToolError(f"{where}: missing fields {missing}")
        v = {k: check_value(x, props[k], f"{where}.{k}") for k, x in v.items() if k in props}
    if "enum" in schema and v not in schema["enum"]:
        raise ToolError(f"{where}: must be one of {schema['enum']}, got {v!r}"[:200])
    return v


def call_tool(domain: str, db: OverlayDB, name: str, arguments: Any) -> Any:
    """Run one tool call; raise ToolError with a message for anything the tool refuses.

    The arguments are checked against the tool's schema first; a write that fails part-way is rolled
    back, so a refused call never changes the database."""
    tools = DOMAINS[domain]
    if name not in tools:
        raise ToolError(f"Tool '{name}' not found.")
    t = tools[name]
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    missing = [p for p in t.required if p not in arguments]
    extra = [p for p in arguments if p not in t.params]
    if missing or extra:
        raise ToolError(f"{name}: missing arguments {missing}" if missing else f"{name}: unknown arguments {extra}")
    args = {k: check_value(v, t.params[k], f"{name}: {k}") for k, v in arguments.items()}
    saved = copy.deepcopy(db.over) if t.kind == "write" else None
    try:
        return t.fn(db, **args)
    except Exception as e:  # noqa: BLE001 - every refusal becomes the agent's error message, as in tau2
        if saved is not None:
            db.over = saved
        raise ToolError(str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}") from None
