"""The tau2-bench retail domain's tools, written for this project: names, arguments, database effects and
error conditions follow tau2-bench (orders, users, products; cancel, exchange, modify, return)."""
from __future__ import annotations

import json
from typing import Callable

from .db import OverlayDB
from .tooling import S, Tool, ToolError, calculate_tool, round2, transfer_tool


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
        refunds.append({"transaction_type": "refund", "amount": p["amount"],
                        "payment_method_id": p["payment_method_id"]})
        pm = _retail_payment(db, order["user_id"], p["payment_method_id"])
        if pm["source"] == "gift_card":
            pm = _retail_payment(db, order["user_id"], p["payment_method_id"], write=True)
            pm["balance"] = round2(pm["balance"] + p["amount"])
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
        diff = round2(diff)
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
        pm["balance"] = round2(pm["balance"] - diff)
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
        pm["balance"] = round2(pm["balance"] - amount)
    old = _retail_payment(db, order["user_id"], old_id)
    if old["source"] == "gift_card":
        old = _retail_payment(db, order["user_id"], old_id, write=True)
        old["balance"] = round2(old["balance"] + amount)
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
         "to 2 decimal places.", {"expression": S}, ["expression"], calculate_tool),
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
         "policy.", {"summary": S}, ["summary"], transfer_tool),
]
