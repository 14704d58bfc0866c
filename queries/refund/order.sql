-- name: OrderInsert :one
-- Records an order. No row back means the client has an order of that id already.
INSERT INTO demo_order (client, order_id, customer_id, amount)
VALUES (@client, @order_id, @customer_id, @amount)
ON CONFLICT (client, order_id) DO NOTHING
RETURNING created_at;

-- name: OrderGet :one
SELECT * FROM demo_order WHERE client = @client AND order_id = @order_id;
