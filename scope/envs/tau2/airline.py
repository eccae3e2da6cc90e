"""The tau2-bench airline domain's tools, written for this project: names, arguments, database effects and
error conditions follow tau2-bench (reservations, flights, users; book, cancel, update, certificates)."""
from __future__ import annotations


from .db import OverlayDB
from .tooling import S, Tool, ToolError, calculate_tool, transfer_tool


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
         {"user_id": S, "origin": S, "destination": S,
          "flight_type": {"type": "string", "enum": ["one_way", "round_trip"]},
          "cabin": CABIN, "flights": FLIGHTS, "passengers": PASSENGERS, "payment_methods": PAYMENTS,
          "total_baggages": COUNT, "nonfree_baggages": COUNT, "insurance": {"type": "string", "enum": ["yes", "no"]}},
         ["user_id", "origin", "destination", "flight_type", "cabin", "flights", "passengers", "payment_methods",
          "total_baggages", "nonfree_baggages", "insurance"], a_book_reservation),
    Tool("calculate", "generic", "Calculate a mathematical expression (numbers, + - * / and parentheses).",
         {"expression": S}, ["expression"], calculate_tool),
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
         transfer_tool),
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
