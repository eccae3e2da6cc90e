"""The tools of the tau2-bench retail and airline domains, written for this project.

Names, arguments, database effects and error conditions follow tau2-bench. A tool raises
``ToolError`` with a message for any refused call; the environment shows that message to the agent.
Each tool is declared with a JSON schema (shown to the agent) and a kind: read, write or generic.
"""
from __future__ import annotations

import json
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
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": self.params, "required": self.required}}


S = {"type": "string"}
I = {"type": "integer"}
LS = {"type": "array", "items": {"type": "string"}}


def _calculate(db, expression: str) -> str:
    if not isinstance(expression, str) or not all(c in "0123456789+-*/(). " for c in expression):
        raise ToolError("Invalid characters in expression")
    try:
        return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))  # noqa: S307 - digits/operators only
    except Exception as e:  # noqa: BLE001
        raise ToolError(f"Invalid expression: {type(e).__name__}") from None


def _transfer(db, summary: str) -> str:
    return "Transfer successful"


def _r2(x: float) -> float:
    return round(x, 2)


# ---- retail ---------------------------------------------------------------------------------------
def _order(db: OverlayDB, order_id: str, write: bool = False) -> dict:
    if not isinstance(order_id, str) or not db.has("orders", order_id):
        raise ToolError("Order not found")
    return db.mut("orders", order_id) if write else db.get("orders", order_id)


def _user(db: OverlayDB, user_id: str, write: bool = False) -> dict:
    if not isinstance(user_id, str) or not db.has("users", user_id):
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


def _price_diff(db: OverlayDB, order: dict, item_ids, new_item_ids, forbid_same: bool) -> tuple[float, list]:
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match")
    diff, variants = 0.0, []
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
    return _r2(diff), variants


def _as_str_list(x: Any, name: str) -> list[str]:
    if not isinstance(x, list) or not all(isinstance(i, str) for i in x):
        raise ToolError(f"{name} must be a list of strings")
    return x


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
                   count_msg, forbid_same: bool, balance_msg: str):
    """The checks shared by exchanging delivered items and modifying pending ones."""
    item_ids, new_item_ids = _as_str_list(item_ids, "item_ids"), _as_str_list(new_item_ids, "new_item_ids")
    order = _order(db, order_id)
    if order["status"] != status:
        raise ToolError(status_msg)
    _check_items(order, item_ids, count_msg)
    diff, variants = _price_diff(db, order, item_ids, new_item_ids, forbid_same=forbid_same)
    pm = _retail_payment(db, order["user_id"], payment_method_id)
    if pm["source"] == "gift_card" and pm["balance"] < diff:
        raise ToolError(balance_msg)
    return item_ids, new_item_ids, diff, variants, pm


def r_exchange_delivered_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    item_ids, new_item_ids, diff, _, _ = _validate_swap(
        db, order_id, item_ids, new_item_ids, payment_method_id, "delivered", "Non-delivered order cannot be exchanged",
        lambda i: f"Number of {i} not found.", False, "Insufficient gift card balance to pay for the price difference")
    order = _order(db, order_id, write=True)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return order


def r_find_user_id_by_name_zip(db, first_name: str, last_name: str, zip: str):
    f, l_ = str(first_name).strip().lower(), str(last_name).strip().lower()
    for uid, u in db.items("users"):
        if u["name"]["first_name"].lower() == f and u["name"]["last_name"].lower() == l_ \
                and u["address"]["zip"] == zip:
            return uid
    raise ToolError("User not found")


def r_find_user_id_by_email(db, email: str):
    e = str(email).strip().lower()
    for uid, u in db.items("users"):
        if u["email"].lower() == e:
            return uid
    raise ToolError("User not found")


def r_get_order_details(db, order_id: str):
    return _order(db, order_id)


def r_get_product_details(db, product_id: str):
    if not isinstance(product_id, str) or not db.has("products", product_id):
        raise ToolError("Product not found")
    return db.get("products", product_id)


def r_get_item_details(db, item_id: str):
    for _, p in db.items("products"):
        if item_id in p["variants"]:
            return p["variants"][item_id]
    raise ToolError("Item not found")


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
    return order


def r_modify_pending_order_items(db, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str):
    item_ids, new_item_ids, diff, variants, pm = _validate_swap(
        db, order_id, item_ids, new_item_ids, payment_method_id, "pending", "Non-pending order cannot be modified",
        lambda i: f"{i} not found", True, "Insufficient gift card balance to pay for the new item")
    order = _order(db, order_id, write=True)
    order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund", "amount": abs(diff),
                                     "payment_method_id": payment_method_id})
    if pm["source"] == "gift_card":
        pm = _retail_payment(db, order["user_id"], payment_method_id, write=True)
        pm["balance"] = _r2(pm["balance"] - diff)
    for old, new, v in zip(item_ids, new_item_ids, variants):
        item = next(it for it in order["items"] if it["item_id"] == old)
        item["item_id"], item["price"], item["options"] = new, v["price"], dict(v["options"])
    order["status"] = "pending (item modified)"
    return order


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
    return order


def r_modify_user_address(db, user_id: str, address1: str, address2: str, city: str, state: str, country: str,
                          zip: str):
    user = _user(db, user_id, write=True)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def r_return_delivered_order_items(db, order_id: str, item_ids: list, payment_method_id: str):
    item_ids = _as_str_list(item_ids, "item_ids")
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
    return order


ORDER_ID = {"type": "string", "description": "The order id, such as '#W0000000' (note the leading '#')."}
ADDR = {"address1": S, "address2": S, "city": S, "state": S, "country": S, "zip": S}
ADDR_REQ = ["address1", "address2", "city", "state", "country", "zip"]

RETAIL_TOOLS = [
    Tool("calculate", "generic", "Calculate a mathematical expression (numbers, + - * / and parentheses).",
         {"expression": S}, ["expression"], _calculate),
    Tool("cancel_pending_order", "write", "Cancel a pending order; reason is 'no longer needed' or 'ordered by "
         "mistake'. Payments are refunded (gift cards at once). Ask the user for explicit confirmation first.",
         {"order_id": ORDER_ID, "reason": S}, ["order_id", "reason"], r_cancel_pending_order),
    Tool("exchange_delivered_order_items", "write", "Exchange items of a delivered order for new items of the same "
         "product. Can be done once per order. Ask the user for explicit confirmation first.",
         {"order_id": ORDER_ID, "item_ids": LS, "new_item_ids": LS, "payment_method_id": S},
         ["order_id", "item_ids", "new_item_ids", "payment_method_id"], r_exchange_delivered_order_items),
    Tool("find_user_id_by_name_zip", "read", "Find a user id by first name, last name and zip code.",
         {"first_name": S, "last_name": S, "zip": S}, ["first_name", "last_name", "zip"], r_find_user_id_by_name_zip),
    Tool("find_user_id_by_email", "read", "Find a user id by email.", {"email": S}, ["email"],
         r_find_user_id_by_email),
    Tool("get_order_details", "read", "Get the status and details of an order.", {"order_id": ORDER_ID},
         ["order_id"], r_get_order_details),
    Tool("get_product_details", "read", "Get the inventory details of a product (product id, not item id).",
         {"product_id": S}, ["product_id"], r_get_product_details),
    Tool("get_item_details", "read", "Get the inventory details of an item (item id).", {"item_id": S}, ["item_id"],
         r_get_item_details),
    Tool("get_user_details", "read", "Get the details of a user, including their orders.", {"user_id": S},
         ["user_id"], r_get_user_details),
    Tool("list_all_product_types", "read", "List the name and product id of all 50 product types.", {}, [],
         r_list_all_product_types),
    Tool("modify_pending_order_address", "write", "Modify the shipping address of a pending order. Ask the user "
         "for explicit confirmation first.", {"order_id": ORDER_ID, **ADDR}, ["order_id"] + ADDR_REQ,
         r_modify_pending_order_address),
    Tool("modify_pending_order_items", "write", "Modify items of a pending order to other items of the same "
         "product. Can be done once per order. Ask the user for explicit confirmation first.",
         {"order_id": ORDER_ID, "item_ids": LS, "new_item_ids": LS, "payment_method_id": S},
         ["order_id", "item_ids", "new_item_ids", "payment_method_id"], r_modify_pending_order_items),
    Tool("modify_pending_order_payment", "write", "Modify the payment method of a pending order. Ask the user for "
         "explicit confirmation first.", {"order_id": ORDER_ID, "payment_method_id": S},
         ["order_id", "payment_method_id"], r_modify_pending_order_payment),
    Tool("modify_user_address", "write", "Modify the default address of a user. Ask the user for explicit "
         "confirmation first.", {"user_id": S, **ADDR}, ["user_id"] + ADDR_REQ, r_modify_user_address),
    Tool("return_delivered_order_items", "write", "Return items of a delivered order; the refund goes to the "
         "original payment method or a gift card. Ask the user for explicit confirmation first.",
         {"order_id": ORDER_ID, "item_ids": LS, "payment_method_id": S}, ["order_id", "item_ids", "payment_method_id"],
         r_return_delivered_order_items),
    Tool("transfer_to_human_agents", "generic", "Transfer the user to a human agent with a summary. Only if the "
         "user asks for one or the issue cannot be solved with the tools and policy.", {"summary": S}, ["summary"],
         _transfer),
]


# ---- airline --------------------------------------------------------------------------------------
NOW = "2024-05-15T15:00:00"
AIRPORTS = [("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
            ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
            ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
            ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
            ("PHL", "Philadelphia"), ("LGA", "LaGuardia")]


def _key(db: OverlayDB, table: str, key: Any, what: str) -> str:
    """Resolve a key exactly, or ignoring surrounding space and case."""
    if isinstance(key, str):
        if db.has(table, key):
            return key
        k = key.strip().lower()
        for cand in db.keys(table):
            if cand.lower() == k:
                return cand
    raise ToolError(f"{what} {key} not found")


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


def _dicts(x: Any, name: str, fields: list[str]) -> list[dict]:
    if not isinstance(x, list) or not all(isinstance(i, dict) for i in x):
        raise ToolError(f"{name} must be a list of objects")
    for i in x:
        missing = [f for f in fields if f not in i]
        if missing:
            raise ToolError(f"{name}: missing fields {missing}")
    return x


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
                    "scheduled_arrival_time_est": f["scheduled_arrival_time_est"],
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
    flights = _dicts(flights, "flights", ["flight_number", "date"])
    passengers = _dicts(passengers, "passengers", ["first_name", "last_name", "dob"])
    payment_methods = _dicts(payment_methods, "payment_methods", ["payment_id", "amount"])
    if cabin not in CABINS:
        raise ToolError(f"Invalid cabin {cabin!r}")
    if flight_type not in ("one_way", "round_trip") or insurance not in ("yes", "no"):
        raise ToolError("flight_type must be one_way or round_trip and insurance yes or no")
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
    return res


def a_cancel_reservation(db, reservation_id):
    _, res = _a_res(db, reservation_id, write=True)
    res["payment_history"].extend([{"payment_id": p["payment_id"], "amount": -p["amount"]}
                                   for p in list(res["payment_history"])])
    res["status"] = "cancelled"
    return res


def a_get_reservation_details(db, reservation_id):
    return _a_res(db, reservation_id)[1]


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
            user["payment_methods"][pid] = {"id": pid, "amount": amount, "source": "certificate"}
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
    return res


def a_update_reservation_flights(db, reservation_id, cabin, flights, payment_id):
    flights = _dicts(flights, "flights", ["flight_number", "date"])
    if cabin not in CABINS:
        raise ToolError(f"Invalid cabin {cabin!r}")
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
    return res


def a_update_reservation_passengers(db, reservation_id, passengers):
    passengers = _dicts(passengers, "passengers", ["first_name", "last_name", "dob"])
    rk, res = _a_res(db, reservation_id)
    if len(passengers) != len(res["passengers"]):
        raise ToolError("Number of passengers does not match")
    _, res = _a_res(db, rk, write=True)
    res["passengers"] = [dict(p) for p in passengers]
    return res


def a_get_flight_status(db, flight_number, date):
    return _flight_date(db, flight_number, date)[2]["status"]


FLIGHTS = {"type": "array", "items": {"type": "object", "properties": {"flight_number": S, "date": S},
                                      "required": ["flight_number", "date"]}}
PASSENGERS = {"type": "array", "items": {"type": "object", "properties": {"first_name": S, "last_name": S, "dob": S},
                                         "required": ["first_name", "last_name", "dob"]}}
PAYMENTS = {"type": "array", "items": {"type": "object", "properties": {"payment_id": S, "amount": I},
                                       "required": ["payment_id", "amount"]}}
CABIN = {"type": "string", "enum": list(CABINS)}

AIRLINE_TOOLS = [
    Tool("book_reservation", "write", "Book a reservation. Ask the user for explicit confirmation first.",
         {"user_id": S, "origin": S, "destination": S, "flight_type": {"type": "string", "enum": ["one_way", "round_trip"]},
          "cabin": CABIN, "flights": FLIGHTS, "passengers": PASSENGERS, "payment_methods": PAYMENTS,
          "total_baggages": I, "nonfree_baggages": I, "insurance": {"type": "string", "enum": ["yes", "no"]}},
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
         {"user_id": S, "amount": I}, ["user_id", "amount"], a_send_certificate),
    Tool("transfer_to_human_agents", "generic", "Transfer the user to a human agent with a summary. Only if the "
         "user asks for one or the issue cannot be solved with the tools and policy.", {"summary": S}, ["summary"],
         _transfer),
    Tool("update_reservation_baggages", "write", "Update the baggage numbers of a reservation. Ask the user for "
         "explicit confirmation first.", {"reservation_id": S, "total_baggages": I, "nonfree_baggages": I,
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


def call_tool(domain: str, db: OverlayDB, name: str, arguments: Any) -> Any:
    """Run one tool call; raise ToolError with a message for anything the tool refuses."""
    tools = DOMAINS[domain]
    if name not in tools:
        raise ToolError(f"Unknown tool {name!r}; available: {', '.join(sorted(tools))}")
    t = tools[name]
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a JSON object")
    missing = [p for p in t.required if p not in arguments]
    extra = [p for p in arguments if p not in t.params]
    if missing or extra:
        raise ToolError(f"{name}: missing arguments {missing}" if missing else f"{name}: unknown arguments {extra}")
    try:
        return t.fn(db, **arguments)
    except ToolError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise ToolError(f"{name}: invalid arguments ({type(e).__name__}: {e})") from None
